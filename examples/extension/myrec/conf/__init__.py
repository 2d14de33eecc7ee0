"""The package's option files, found by ``hydra.searchpath=[pkg://myrec.conf]``."""
