"""Client-level differential privacy: clip-and-noise mechanisms and a per-client privacy accountant.

``import fedrec.privacy`` does not import Opacus (it is loaded on the first accounting call) or Lightning.
"""
from fedrec.privacy.accountant import (
    ClientAccountant,
    PrivacyBudgetExceeded,
    opacus_accountant,
    uniform_epsilon_per_round,
    uniform_noise_multiplier,
)
from fedrec.privacy.client_dp import ClientDP, best_rdp_order, rdp_conversion_cost
from fedrec.privacy.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    NoiseMechanism,
    analytic_gaussian_delta,
    analytic_gaussian_noise_multiplier,
    classical_gaussian_noise_multiplier,
    rdp_noise_multiplier,
)

__all__ = [
    "ClientAccountant",
    "ClientDP",
    "GaussianMechanism",
    "LaplaceMechanism",
    "NoiseMechanism",
    "PrivacyBudgetExceeded",
    "analytic_gaussian_delta",
    "analytic_gaussian_noise_multiplier",
    "best_rdp_order",
    "classical_gaussian_noise_multiplier",
    "opacus_accountant",
    "rdp_conversion_cost",
    "rdp_noise_multiplier",
    "uniform_epsilon_per_round",
    "uniform_noise_multiplier",
]
