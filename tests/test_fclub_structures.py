"""The FCLUB family's kernels take named structures (engine v3): every field is a view of the protocol's buffer or
attribute of the same name, built once and rebuilt when the buffers move, and a missing, misnamed or mistyped
field fails where the structure is built, naming it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrec.privacy import TreeGaussian
from fedrec.protocols import FederatedClustering, LocalClustering
from fedrec.protocols.kernels.club import LocalSettings, LocalState
from fedrec.protocols.kernels.clustering import ClusterParams
from fedrec.protocols.kernels.fclub import Clusters, Partition, PhaseSettings, Traffic, Users
from fedrec.utils.jit import ArrayType, build, field_types

FCLUB = {"settings": PhaseSettings, "partition": Partition, "users": Users, "clusters": Clusters}
CLUB = {"settings": LocalSettings, "state": LocalState}


def fclub() -> FederatedClustering:
    return FederatedClustering(10, 3, replicates=2, num_servers=2, privacy=TreeGaussian(2.0, horizon=100))


def club() -> LocalClustering:
    return LocalClustering(10, 3, replicates=2, method="sclub", num_servers=2)


@pytest.mark.parametrize(("make", "structs", "users"), [(fclub, FCLUB, "users"), (club, CLUB, "state")],
                         ids=["fclub", "club"])
def test_every_field_is_a_view_of_the_module_member_of_its_name(make, structs, users) -> None:
    p = make()
    views = p.kernel_views()
    assert views["params"] is p.params and isinstance(p.params, ClusterParams)
    for key, struct in structs.items():
        view = views[key]
        assert type(view) is struct
        for name, kind in field_types(struct).items():
            mine = getattr(p, name)
            if isinstance(kind, ArrayType):
                array = mine.numpy() if isinstance(mine, torch.Tensor) else mine
                assert np.shares_memory(getattr(view, name), array), (key, name)
            elif name != "method":  # LocalSettings.method is the code of LocalClustering.method
                assert getattr(view, name) == mine, (key, name)
    p.float().double()  # the buffers are replaced: the views follow
    assert not np.shares_memory(views[users].V, p.V.numpy())
    assert np.shares_memory(p.kernel_views()[users].V, p.V.numpy())


def test_fclub_traffic_views_the_ledger() -> None:
    p = fclub()
    traffic = p.kernel_views()["traffic"]
    assert type(traffic) is Traffic
    assert np.shares_memory(traffic.server, p.ledger.traffic("server").numpy())
    assert np.shares_memory(traffic.global_server, p.ledger.traffic("global").numpy())


STRUCTS = [Partition, Users, Clusters, PhaseSettings, LocalState, LocalSettings, ClusterParams]


def source_of(struct: type) -> dict:
    """The fields of ``struct`` from a protocol that fills it."""
    p = fclub() if struct in FCLUB.values() else club()
    if struct is ClusterParams:
        return p.params._asdict()
    extra = {"method": 2} if struct is LocalSettings else {}
    return {**{name: getattr(p, name) for name in field_types(struct)}, **extra}


@pytest.mark.parametrize("struct", STRUCTS, ids=[s.__name__ for s in STRUCTS])
def test_a_missing_field_fails_at_build_naming_it(struct: type) -> None:
    source = source_of(struct)
    build(struct, source)  # complete: builds
    for name in field_types(struct):
        with pytest.raises(TypeError, match=rf"^{struct.__name__}\.{name}: dict has no field '{name}'$"):
            build(struct, {k: v for k, v in source.items() if k != name})


@pytest.mark.parametrize("struct", STRUCTS, ids=[s.__name__ for s in STRUCTS])
def test_a_mistyped_or_unknown_field_fails_at_build_naming_it(struct: type) -> None:
    source = source_of(struct)
    for name, kind in field_types(struct).items():
        if isinstance(kind, ArrayType):  # the wrong dtype, then the wrong rank
            wrong = np.zeros((2,) * kind.ndim, dtype=np.int32)
            with pytest.raises(TypeError, match=rf"^{struct.__name__}\.{name}: expected a {np.dtype(kind.dtype)} "
                                                rf"array of {kind.ndim} dimension\(s\), got int32 array"):
                build(struct, source, **{name: wrong})
            with pytest.raises(TypeError, match=rf"^{struct.__name__}\.{name}: expected .* got "):
                build(struct, source, **{name: np.zeros((2,) * (kind.ndim + 1), dtype=kind.dtype)})
        else:
            with pytest.raises(TypeError, match=rf"^{struct.__name__}\.{name}: expected {kind.__name__}, got str"):
                build(struct, source, **{name: "1"})
    with pytest.raises(TypeError, match=rf"^{struct.__name__} has no field\(s\) \['lambda_'\]$"):
        build(struct, source, lambda_=1.0)
