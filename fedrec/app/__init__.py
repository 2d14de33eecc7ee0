"""The application layer: the command lines (``train.py``'s run, the privacy audit, sweep summaries), the check
of a command line against the config files, the builders that turn a config into a run, run and sweep folders, and
plots. The library below it (bandits, protocols, tasks, the trainer) never imports it."""
