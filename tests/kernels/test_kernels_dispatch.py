"""Backend selection and dispatch rules: explicit, reported, no silent fallback."""

import pytest
import torch

import kvstate.kernels as K
from kvstate.kernels import (
    ENV_VAR,
    Backend,
    BackendUnavailableError,
    KernelInputError,
    LaunchConfig,
    active_backend,
    select_backend,
)


def test_auto_choice_under_the_simulator_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    choice = active_backend()
    assert choice.backend is Backend.SIMULATOR and "NUMBA_ENABLE_CUDASIM=1" in choice.reason
    monkeypatch.setenv(ENV_VAR, "auto")
    assert active_backend().backend is Backend.SIMULATOR


def test_env_var_forces_and_argument_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "torch")
    choice = active_backend()
    assert choice.backend is Backend.TORCH and choice.reason == f"forced by {ENV_VAR}=torch"
    assert select_backend("simulator") == K.BackendChoice(Backend.SIMULATOR, "forced by argument")
    assert select_backend("auto").backend is Backend.SIMULATOR  # "auto" ignores the env var
    calls: list[int] = []
    real = K.reference.gather_blocks_ref

    def spy(*a: object, **kw: object) -> torch.Tensor:
        calls.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(K.reference, "gather_blocks_ref", spy)
    tier, table = torch.zeros(2, 4, dtype=torch.uint8), torch.tensor([1])
    K.gather_blocks(tier, table)  # env says torch: the reference runs
    assert calls == [1]
    K.gather_blocks(tier, table, backend=Backend.SIMULATOR)
    assert calls == [1]


def test_bad_or_unavailable_backends_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "tpu")
    with pytest.raises(KernelInputError, match="unknown kernel backend 'tpu'"):
        active_backend()
    monkeypatch.delenv(ENV_VAR)
    with pytest.raises(BackendUnavailableError, match="CUDA forced by argument.*simulator"):
        select_backend(Backend.CUDA)
    with pytest.raises(BackendUnavailableError):
        K.gather_blocks(torch.zeros(2, 4), torch.tensor([0]), backend="cuda")


def test_kernel_errors_propagate_without_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("kernel exploded")

    import kvstate.kernels.paged as paged  # loaded lazily by the dispatcher on first launch

    monkeypatch.setattr(paged, "launch_gather", broken)
    with pytest.raises(RuntimeError, match="kernel exploded"):
        K.gather_blocks(torch.zeros(2, 4), torch.tensor([1]), backend=Backend.SIMULATOR)


def test_device_rules() -> None:
    meta = torch.empty(2, 4, device="meta")
    with pytest.raises(KernelInputError, match="SIMULATOR needs CPU"):
        K.gather_blocks(meta, torch.tensor([0], device="meta"), backend=Backend.SIMULATOR)
    with pytest.raises(KernelInputError, match="different devices"):
        K.gather_blocks(
            torch.zeros(2, 4), torch.tensor([0], device="meta"), backend=Backend.SIMULATOR
        )


def test_launch_config_validation_and_override_scope() -> None:
    with pytest.raises(ValueError, match="power of two"):
        LaunchConfig(threads=3, max_blocks=1)
    with pytest.raises(ValueError, match="max_blocks"):
        LaunchConfig(threads=1, max_blocks=0)
    cfg = LaunchConfig(threads=2, max_blocks=1)
    with K.launch_override(cfg):
        assert K.dispatch._cfg(Backend.SIMULATOR) is cfg
    assert K.dispatch._cfg(Backend.SIMULATOR) is not cfg
