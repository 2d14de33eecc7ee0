"""An example of a research package built on fedrec without editing it: a model written with ordinary layers, an
aggregation rule, an attack, their option files (``myrec/conf``) and an experiment; see fedrec's page "Extend fedrec
from your own package"."""
