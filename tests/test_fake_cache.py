"""The shortcuts through FakeTensorMode (kronos_tune.torch_private, on private PyTorch names) change nothing but
speed: light keys give the answers the mode's own keys give, op by op, and planner traces and whole plans are
identical with the shortcuts off (the public FakeTensorMode path)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kronos_tune import torch_private
from kronos_tune.torch_private import CountingFakeMode
from kronos_tune.plan import planner, setup_traces
from kronos_tune.memory.estimate import _CpuOnlyTracker
from tests.test_planner import EMULATION, tiny_config, two_rank_tiny  # noqa: F401 - a fixture


@pytest.fixture
def fresh_light_keys(monkeypatch: pytest.MonkeyPatch) -> dict:
    entries: dict = {}
    monkeypatch.setattr(torch_private.LightKeys, "entries", entries)
    monkeypatch.setattr(torch_private, "SHORTCUTS", True)
    return entries


def _shortcut_mode() -> FakeTensorMode:
    return CountingFakeMode.make(_CpuOnlyTracker().see_outputs, shortcuts=True)


def _described(out: object) -> object:
    if isinstance(out, torch.Tensor):
        return (out.dtype, tuple(out.shape), out.stride(), out.storage_offset(), out.requires_grad,
                out.untyped_storage().nbytes(), str(out.device))
    if isinstance(out, (list, tuple)):
        return [_described(item) for item in out]
    return out


def _calls(base: torch.Tensor) -> list:
    """Pairs of calls of one op whose arguments differ in one fact that a light key must hold (strides,
    storage offset, storage size, dtype, a Python number's type, an argument's value): where the key left it
    out, the second call of a pair would get the first one's answer."""
    transposed = torch.empty(4, 6).t()  # base's shape, other strides
    whole = torch.empty(8, 4)
    head, tail = whole[:6], whole[2:]  # base's shape and strides in one storage, at another offset
    longer = torch.empty(7, 4)[:6]  # base's shape, strides and offset in a larger storage
    ints = torch.empty(6, 4, dtype=torch.int32)  # base's shape, strides and storage size, another dtype
    counts = torch.empty(6, 4, dtype=torch.int64)
    return [
        lambda: base * 2, lambda: transposed * 2,
        lambda: head.view(-1), lambda: tail.view(-1),
        lambda: base.view(-1), lambda: longer.view(-1),
        lambda: base.neg(), lambda: ints.neg(),
        lambda: counts * 2, lambda: counts * 2.0,
        lambda: base.sum(dim=0), lambda: base.sum(dim=1),
        lambda: torch.mm(base.t(), base), lambda: base.split(2, dim=1), lambda: head.add_(1),
        lambda: torch.zeros_like(base), lambda: base.to(torch.bfloat16), lambda: transposed.contiguous(),
    ]


def test_a_light_key_tells_apart_every_fact_the_mode_s_key_does(fresh_light_keys: dict) -> None:
    def answers(mode: FakeTensorMode, times: int) -> list:
        with mode:
            calls = _calls(torch.empty(6, 4))
            rounds = [[_described(call()) for call in calls] for _ in range(times)]
        return rounds

    plain = FakeTensorMode()
    plain.cache_enabled = False  # every op from its kernel: the reference
    (reference,) = answers(plain, 1)
    first, second = answers(_shortcut_mode(), 2)  # the second round is answered from light keys
    assert first == reference
    assert second == reference
    assert sum(entry is not torch_private.UNCACHED for entry in fresh_light_keys.values()) >= 10
    # strides are in the key: a view of the transposed tensor fails as the mode makes it fail
    def view_error(mode: FakeTensorMode) -> type:
        with mode:
            base = torch.empty(6, 4)
            base.view(-1)
            with pytest.raises(Exception) as raised:
                base.t().view(-1)
        return type(raised.value)

    assert view_error(_shortcut_mode()) is view_error(plain)


def test_an_argument_a_light_key_does_not_describe_goes_through_the_mode() -> None:
    mode = _shortcut_mode()
    keys = torch_private.LightKeys(mode)
    with mode:
        fake = torch.empty(3)
    with FakeTensorMode():
        other = torch.empty(3)
    assert keys.key(torch.ops.aten.mul.Tensor, (fake, 2), {}) is not None
    assert keys.key(torch.ops.aten.mul.Tensor, (other, 2), {}) is None  # another mode's fake tensor
    assert keys.key(torch.ops.aten.mul.Tensor, (torch.ones(3), 2), {}) is None  # a real tensor
    assert keys.key(torch.ops.aten.mul.Tensor, (fake, object()), {}) is None


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_a_planner_trace_through_light_keys_is_the_trace_of_the_mode_s_own_keys(
        parallelism: str, fresh_light_keys: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config(parallelism)
    light = setup_traces.trace_steps(config, (2, 5), 2, EMULATION)
    light_again = setup_traces.trace_steps(config, (2, 5), 2, EMULATION)  # every op now found by its light key
    assert fresh_light_keys
    if parallelism == "fsdp":  # FSDP's copy-in op, which the mode does not cache, went to its meta kernel
        assert torch_private._META_ROUTES.get(torch.ops.fsdp.all_gather_copy_in.default) is True
    monkeypatch.setattr(torch_private, "SHORTCUTS", False)  # FakeTensorMode's own dispatch for every op
    own = setup_traces.trace_steps(config, (2, 5), 2, EMULATION)
    for traced in (light, light_again):
        for (probe, trace), (own_probe, own_trace) in zip(traced, own):
            assert probe == own_probe
            assert trace.ops == own_trace.ops and trace.live_bytes == own_trace.live_bytes
            assert trace.result == own_trace.result


def test_a_plan_without_the_shortcuts_is_the_plan_with_them(two_rank_tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRONOS_TUNE_CACHE_DIR", "off")
    monkeypatch.setattr(torch_private, "SHORTCUTS", True)
    setups = ("fsdp", "fsdp+checkpointing", "fsdp+offload")  # one traced session (the ddp one: the test above)
    with_shortcuts = planner.plan_preset(two_rank_tiny, sizes=("tiny",), setups=setups)
    monkeypatch.setattr(torch_private, "SHORTCUTS", False)
    assert type(CountingFakeMode.make(_CpuOnlyTracker().see_outputs)) is CountingFakeMode
    assert planner.plan_preset(two_rank_tiny, sizes=("tiny",), setups=setups).to_dict() == with_shortcuts.to_dict()


def test_the_shortcuts_are_off_when_the_environment_says_so_or_a_private_name_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert torch_private.shortcuts_available()  # the PyTorch the suite runs on has every name they use
    monkeypatch.setenv(torch_private.SHORTCUTS_ENV, "off")
    assert not torch_private.shortcuts_wanted()
    monkeypatch.delenv(torch_private.SHORTCUTS_ENV)
    monkeypatch.delattr(torch._subclasses.fake_tensor.FakeTensorMode, "_output_from_cache_entry")
    assert not torch_private.shortcuts_available() and not torch_private.shortcuts_wanted()


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_fsdp_optimizer_steps_on_local_shards_trace_what_dtensor_s_dispatch_traces(
        impl: str, fresh_light_keys: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-place element-wise optimizer ops on FSDP's DTensors run on their local shards (no sharding
    propagation), and the trace is the one DTensor's own dispatch gives, op by op."""
    from kronos_tune.memory.estimate import CudaEmulation

    emulation = CudaEmulation(context_overhead_bytes=0, optimizer_impl=impl)
    calls = {"local": 0}
    real = torch_private.local_elementwise_call

    def counted(func, args, kwargs):  # type: ignore[no-untyped-def]
        local = real(func, args, kwargs)
        calls["local"] += local is not None
        return local

    monkeypatch.setattr(torch_private, "local_elementwise_call", counted)
    config = tiny_config("fsdp")
    shortcut = setup_traces.trace_steps(config, (3,), 2, emulation)
    assert calls["local"] >= 4  # prime and step: the clipping's scale and at least one optimizer op each
    monkeypatch.setattr(torch_private, "SHORTCUTS", False)
    own = setup_traces.trace_steps(config, (3,), 2, emulation)
    for (probe, trace), (own_probe, own_trace) in zip(shortcut, own):
        assert probe == own_probe
        assert trace.ops == own_trace.ops and trace.live_bytes == own_trace.live_bytes


def test_an_op_dtensor_would_redistribute_or_refuse_is_left_to_dtensor() -> None:
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    from kronos_tune.plan.setup_traces import SimulatedRanks

    mul_ = torch.ops.aten._foreach_mul_.Tensor
    with SimulatedRanks(2) as ranks:
        def dtensor(shape: tuple[int, ...], placement: object) -> DTensor:
            return DTensor.from_local(torch.ones(shape), ranks.mesh, [placement], run_check=False)

        rows, column = dtensor((2, 3), Shard(0)), dtensor((3, 2), Shard(0))
        scale = dtensor((), Replicate())
        local = torch_private.local_elementwise_call(mul_, ([rows, column], scale), {})
        assert local is not None
        (tensors, local_scale), kwargs = local
        assert tensors[0] is rows._local_tensor and tensors[1] is column._local_tensor
        assert local_scale is scale._local_tensor and kwargs == {}
        assert torch_private.local_elementwise_call(mul_, ([rows, dtensor((2, 3), Shard(1))], scale), {}) is None
        assert torch_private.local_elementwise_call(mul_, ([rows], dtensor((), Partial())), {}) is None
        partial_sums = [dtensor((2, 3), Partial()), dtensor((3,), Partial())]  # adding to them needs their sums
        add_ = torch.ops.aten._foreach_add_.Scalar
        assert torch_private.local_elementwise_call(add_, (partial_sums, 1.0), {}) is None
        add_lists = torch.ops.aten._foreach_add_.List
        assert torch_private.local_elementwise_call(add_lists, ([rows], [dtensor((2, 3), Shard(0))]), {}) is not None
        assert torch_private.local_elementwise_call(add_lists, ([rows], [dtensor((3, 3), Shard(0))]), {}) is None
        assert torch_private.local_elementwise_call(mul_, ([rows], dtensor((2, 3), Shard(0))), {}) is None  # broadcast
        assert torch_private.local_elementwise_call(mul_, ([rows], dtensor((2,), Replicate())), {}) is None
        assert torch_private.local_elementwise_call(mul_, ([rows], torch.ones(2)), {}) is None  # not 0-dim
        assert torch_private.local_elementwise_call(torch.ops.aten._foreach_norm.Scalar, ([rows], 2), {}) is None
