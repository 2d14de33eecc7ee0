"""Rating datasets (MovieLens-100K, FilmTrust, MovieLens-1M, the Monti et al. Douban, Flixster and YahooMusic
matrices, and synthetic ones of any size) split for federated recommendation, explicit or implicit."""
from fedrec.data.download import default_data_dir
from fedrec.data.implicit import SPLITS, ImplicitData, ItemSets, Triples, load_implicit, sample_negatives
from fedrec.data.monti import MontiMatrix, read_monti
from fedrec.data.ratings import (
    DATASETS,
    NORMALIZATIONS,
    RatingData,
    Ratings,
    arrival_rounds,
    group_users,
    load_filmtrust,
    load_ml1m,
    load_ml100k,
    load_ratings,
    read_ratings,
)
from fedrec.data.synthetic import synthetic_ratings

__all__ = [
    "DATASETS",
    "ImplicitData",
    "ItemSets",
    "NORMALIZATIONS",
    "MontiMatrix",
    "RatingData",
    "Ratings",
    "SPLITS",
    "Triples",
    "arrival_rounds",
    "default_data_dir",
    "group_users",
    "load_filmtrust",
    "load_implicit",
    "load_ml1m",
    "load_ml100k",
    "load_ratings",
    "read_monti",
    "read_ratings",
    "sample_negatives",
    "synthetic_ratings",
]
