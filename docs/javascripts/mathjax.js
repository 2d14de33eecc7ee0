// MathJax settings for pymdownx.arithmatex's generic output: it wraps each formula in an element of class
// "arithmatex" with \( \) or \[ \] delimiters, and MathJax typesets those elements only.
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]]},
  options: {ignoreHtmlClass: ".*", processHtmlClass: "arithmatex"},
  svg: {fontCache: "global"},
};
