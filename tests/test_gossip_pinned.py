"""The compiled Gossip_UCB / Fed_UCB loop pinned to its outputs before the speed work of issue 29 (item 3): the
arms of every round, the regret and ϑ of two replicates over 4000 rounds (played in calls of 1500, so that a call's
start is crossed), recorded with the kernel of commit 08353ad. The speed-ups (stream states computed once, the
finite-ε index computed exactly only where its bound reaches the maximum, ...) must leave every draw, decision and
sum bit for bit as they were; the compiled ≡ torch ≡ reference tests check the same against independent code."""
from __future__ import annotations

import hashlib
import math

import pytest

from fedrec.envs.mab import MultiAgentMAB
from fedrec.federation.topology import complete, ring
from fedrec.privacy import TreeLaplace
from fedrec.protocols.gossip import CentralUCB, FedUCB, LocalUCB

#: (setting, ε) → (sha1 of the arms, regret (R, N), Σ ϑ) of the kernel before the speed-ups
PINNED = {
    "k3_1.0": ("0df8d7272216098aecfb24a061700ee217b0b8e0",
               [[470.9786734229403, 471.2177488916829, 470.26144701671245],
                [700.8292419933472, 701.020673085648, 701.0206730856477]],
               13.106869987847954),
    "k3_5.0": ("23b0296939c00654fd19b3605783dc3e94ebd2ab",
               [[523.9022837211241, 523.9438253383033, 524.3804346586093],
                [526.6441898617794, 526.6465642195193, 526.6964995899888]],
               12.950601690619271),
    "k3_inf": ("21c7df02143a3047c21545c790a3a7a2a31f1426",
               [[252.92905699251713, 252.59383918435833, 252.64004615330484],
                [272.5756674248541, 272.7732012764174, 273.2976425465616]],
               13.01214793677837),
    "ring10_1.0": ("93539f6cb7b0e111704a0deefbc5e5158b4297ed",
                   [[582.2425005963244, 582.526736867965, 582.526736867965, 582.4718321161209, 582.5347591861376,
                     582.48185755876, 582.2965003878943, 582.4066059066101, 582.1346942171026, 582.2425005963244],
                    [578.7416687368072, 578.7559096504503, 578.5837565503011, 578.5918043401647, 578.6344452042377,
                     578.6973722742545, 578.7022065008114, 578.7336209469437, 578.6906834409396, 578.3867797189083]],
                   89.40206712302856),
    "ring10_5.0": ("c635f5b34fd078f5c60ee67f8522bb3fc653f995",
                   [[580.9061653735164, 581.3694181455985, 581.2616117663767, 581.25268448793, 581.2087101389991,
                     581.0885791776441, 581.0676494306862, 580.8974988281, 581.1438060431102, 580.8512606216723],
                    [577.4544034494207, 577.6274360381534, 577.3914763794039, 577.5742122971537, 577.5218681040634,
                     577.4544034494206, 577.4547000913517, 577.5173305194375, 577.5173305194373, 577.4020592563304]],
                   89.71539872758493),
    "ring10_inf": ("1b0cf1dd458b8bb663a3a0537019d117d76b02ca",
                   [[549.9162894131271, 550.8151585079969, 551.1821783878631, 549.3806665159851, 549.4124867647424,
                     550.242466733098, 549.6854524937862, 549.9228626190923, 551.3553941542302, 549.7835731366091],
                    [544.201891685513, 544.1236173787041, 544.8973392920213, 544.5837552254824, 544.1712024761084,
                     544.8991242576278, 544.9022173739057, 545.4793611887659, 543.8211121082423, 543.9596829981089]],
                   100.86337341757144),
}
SETTINGS = {"k3": (3, 5, complete), "ring10": (10, 10, ring)}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_kernel_reproduces_its_pinned_outputs(case: str) -> None:
    setting, eps = case.split("_")
    N, M, topology = SETTINGS[setting]
    env = MultiAgentMAB(N, M, 2, seed=0)
    p = FedUCB(topology(N), M, 10**6, 2, 0, TreeLaplace(float(eps)), backend="compiled")
    digest = hashlib.sha1()
    for steps in (1500, 1500, 1000):
        digest.update(p.play(env, steps, return_arms=True).numpy().tobytes())
    arms_sha1, regret, theta_sum = PINNED[case]
    assert p.regret.tolist() == regret
    assert float(p.theta.numpy().sum()) == theta_sum  # numpy's summation order, as recorded
    assert digest.hexdigest() == arms_sha1
    assert math.isinf(p.epsilon) == (eps == "inf")


#: the baselines and the privacy readings, recorded with the kernel of commit 8c9e6b9 (one loop over the three
#: algorithms, before its phases were named into helpers): (sha1 of the arms, regret (R, N), Σ ϑ), as in PINNED
PINNED_MODES = {
    "local_k3": ("e3d78c53fd174e112dfb04250469ad999b9902d6",
                 [[27.625209323252268, 606.3523876933345, 427.3695276531104],
                  [38.29873494838128, 369.4473198486405, 519.4511202851446]],
                 13.324003997457845),
    "central_ring10": ("02f4586e186455bd811c9c7602a4f7e4d10e3322",
                       [[60.23279299417262, 60.23279299417262, 60.23279299417262, 60.23279299417262, 60.23279299417262,
                         60.23279299417262, 60.23279299417262, 60.23279299417262, 60.23279299417262, 60.23279299417262],
                        [55.95263735175849, 55.95263735175849, 55.95263735175849, 55.95263735175849, 55.95263735175849,
                         55.95263735175849, 55.95263735175849, 55.95263735175849, 55.95263735175849,
                         55.95263735175849]],
                       93.33092478794569),
    "fresh_ring10_1.0": ("6b83f73eff6aa1189ae62b22aa78f70b6900a912",
                         [[582.2335733178776, 582.3077268058352, 582.6545680338706, 582.7077917748702,
                           582.4066059066103, 582.5347591861376, 582.349402015272, 582.3976786281634, 582.5456895890509,
                           582.2987995273884],
                          [578.7022065008115, 578.8614775845402, 578.7536712053185, 578.5895658950328,
                           578.7988471564545, 578.8614775845402, 578.6369802913006, 578.6369802913006,
                           578.8010856015864, 578.550885029194]],
                         88.92653133725196),
    "empty_k3_1.0": ("50a14262b9cf67f70500c3338bf11faa05f22767",
                     [[470.26144701671245, 470.7395979541977, 470.7395979541977],
                      [700.2502000009661, 700.2525743587058, 700.2478256432262]],
                     12.888104085936755),
    "log2_k3_1.0": ("602c23b379e3e1a7f422846cd0bc0b8f1e187318",
                    [[473.84757904785164, 473.84757904785164, 474.32572998533686],
                     [702.5544961817915, 702.365439447231, 702.5592448972711]],
                    12.803275519209214),
}
T = 10**6
MODES = {
    "local_k3": lambda: LocalUCB(complete(3), 5, T, 2, 0, backend="compiled"),
    "central_ring10": lambda: CentralUCB(ring(10), 10, T, 2, 0, backend="compiled"),
    "fresh_ring10_1.0": lambda: FedUCB(ring(10), 10, T, 2, 0, TreeLaplace(1.0), consistency_fresh=True,
                                       backend="compiled"),
    "empty_k3_1.0": lambda: FedUCB(complete(3), 5, T, 2, 0, TreeLaplace(1.0, noise_empty_intervals=True),
                                   backend="compiled"),
    "log2_k3_1.0": lambda: FedUCB(complete(3), 5, T, 2, 0, TreeLaplace(1.0), privacy_log2=True, backend="compiled"),
}


@pytest.mark.parametrize("case", sorted(PINNED_MODES))
def test_the_baselines_and_privacy_readings_reproduce_their_pinned_outputs(case: str) -> None:
    """LOCAL and CENTRAL UCB1, the consistency rule against ñ(t+1), noise on empty tree nodes and log₂ t in the
    privacy term play as the kernel before its rewrite did, draw for draw."""
    p = MODES[case]()
    env = MultiAgentMAB(p.num_agents, p.num_arms, 2, seed=0)
    digest = hashlib.sha1()
    for steps in (1500, 1500, 1000):
        digest.update(p.play(env, steps, return_arms=True).numpy().tobytes())
    arms_sha1, regret, theta_sum = PINNED_MODES[case]
    assert p.regret.tolist() == regret
    assert float(p.theta.numpy().sum()) == theta_sum
    assert digest.hexdigest() == arms_sha1
