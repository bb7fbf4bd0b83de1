"""DistributedDataParallel on 2 processes (gloo, localhost): the ranks train identical parameters, equal to one
process training on the whole batch and to torch's DistributedDataParallel; a crashing rank fails the others."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg

pytest.importorskip("torch.distributed")


def relative_error(value: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(value - expected) / np.linalg.norm(expected))


def test_ranks_train_the_parameters_of_one_process_on_the_global_batch_and_of_torch_ddp(group_results) -> None:
    first, second = group_results("train")
    names = [key.partition("/")[2] for key in first if key.startswith("single/")]
    assert len(names) == 4
    for way in ("eager", "compiled", "compiled-3"):
        for name in names:
            value = first[f"{way}/{name}"]
            np.testing.assert_array_equal(second[f"{way}/{name}"], value, err_msg=f"{way}: {name} differs by rank")
            assert relative_error(value, first[f"single/{name}"]) < 1e-6, (way, name)
            assert relative_error(value, first[f"torch/{name}"]) < 1e-6, (way, name)
    # the compiled step starts each bucket's all-reduce right after the kernels producing what it reads, and waits
    # for it after every start, before the kernels reading the average: the kernels between overlap it
    calls, starts, producers, consumers = (first[f"compiled/{key}"]
                                           for key in ("host_calls", "starts", "producers", "consumers"))
    assert starts.sum() == 2 and (~starts).sum() == 2  # two buckets
    assert (calls[starts] == producers[starts] + 1).all()
    assert calls[starts].max() < calls[~starts].min() and (calls < consumers).all()
    # the first bucket's all-reduce goes on while the backward kernels producing the second bucket's gradients run
    assert calls[starts][0] < producers[starts][1] and calls[~starts][0] > calls[starts][1]
    assert (calls[~starts] > calls[starts]).all() and (np.diff(calls[~starts]) > 0).all()  # waited for in order
    calls, starts = first["compiled-3/host_calls"], first["compiled-3/starts"]
    assert starts.sum() == 3 and (calls[starts] < calls[~starts].min()).all() and (np.diff(calls[~starts]) > 0).all()


def test_buckets_follow_the_order_gradients_are_ready_as_torchs_rebuilt_buckets(group_results) -> None:
    for results in group_results("buckets"):
        assert len(results["torch"]) > 2
        np.testing.assert_array_equal(results["tg"], results["torch"])


def test_module_buffers_follow_rank_0_as_in_torch_ddp(group_results) -> None:
    """Batch norm: rank 0's running statistics are broadcast before each forward, then each rank updates them
    with its own batch; torch's DDP gives each rank the same parameters and statistics."""
    ranks = group_results("train")
    names = [key.partition("/")[2] for key in ranks[0] if key.startswith("torch-norm/")]
    assert "1.running_mean" in names
    for way in ("eager-norm", "compiled-norm"):
        for results in ranks:
            for name in names:
                expected = results[f"torch-norm/{name}"]
                value = results[f"{way}/{name}"]
                if expected.dtype.kind == "f":
                    assert relative_error(value, expected) < 1e-6, (way, name)
                else:
                    np.testing.assert_array_equal(value, expected, err_msg=f"{way}: {name}")
    assert not np.allclose(ranks[0]["torch-norm/1.running_mean"], ranks[1]["torch-norm/1.running_mean"])


@pytest.mark.parametrize("scenario", ["crash-compiled", pytest.param("crash-eager", marks=pytest.mark.slow)])
def test_a_crashing_rank_makes_the_others_fail_clearly(scenario: str, run_ranks) -> None:
    survivor, crashed = run_ranks(scenario, check=False, timeout=60)
    assert crashed.returncode == 3
    assert survivor.returncode != 0 and survivor.results is None
    assert "DistributedError: distributed.all_reduce: the collective failed; another rank has probably stopped" in (
        survivor.output), survivor.output[-2000:]


def mlp() -> tg.nn.Module:
    tg.manual_seed(0)
    return tg.nn.Sequential(tg.nn.Linear(6, 5), tg.nn.Tanh(), tg.nn.Linear(5, 3))


@pytest.mark.parametrize("compiled", [False, True])
def test_alone_it_trains_as_the_module_does(one_process_group: None, compiled: bool) -> None:
    x, y = tg.randn(4, 6), tg.randn(4, 3)
    trained = []
    for wrap in (False, True):
        model = mlp()
        net = tg.nn.parallel.DistributedDataParallel(model) if wrap else model
        optimizer = tg.optim.SGD(model.parameters(), lr=0.1)

        def step() -> tg.Tensor:
            optimizer.zero_grad()
            loss = tg.nn.functional.mse_loss(net(x), y)
            loss.backward()
            optimizer.step()
            return loss

        run = tg.compile(step) if compiled else step
        for _ in range(3):
            run()
        trained.append([p.detach().numpy() for p in model.parameters()])
    for plain, wrapped in zip(*trained):
        np.testing.assert_allclose(wrapped, plain, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cap_mb", [None, 25.0, 0.002, 1e-6])
def test_buckets_are_torchs(one_process_group: None, cap_mb: float | None) -> None:
    """torch's buckets (before the first forward, over the parameters in reverse registration order); by default
    the parameters ready last, from the end until they hold torch's first-bucket bytes, form a bucket of their own."""
    import torch
    from torch._C._distributed_c10d import _compute_bucket_assignment_by_size

    model = tg.nn.Sequential(*(tg.nn.Linear(n, 300) for n in (200, 300, 300, 300, 300)), tg.nn.Linear(300, 3))
    ddp = tg.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    ready_order = [torch.zeros(p.shape) for p in model.parameters()][::-1]
    cap = int((25.0 if cap_mb is None else cap_mb) * 2**20)
    limits = [torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, cap] if cap_mb is None else [cap]
    tail = 0
    while cap_mb is None and sum(t.numel() * 4 for t in ready_order[len(ready_order) - tail:]) < limits[0]:
        tail += 1
    expected, _ = _compute_bucket_assignment_by_size(ready_order[:len(ready_order) - tail], limits)
    sizes = [sum(ready_order[i].numel() for i in bucket) for bucket in expected]
    assert ddp.bucket_sizes == sizes + ([sum(t.numel() for t in ready_order[-tail:])] if tail else [])
    assert cap_mb is not None or len(ddp.bucket_sizes) == 2  # the last 1 MB on its own


def test_state_dict_keys_are_torchs(one_process_group: None) -> None:
    model = mlp()
    ddp = tg.nn.parallel.DistributedDataParallel(model)
    assert list(ddp.state_dict()) == [f"module.{k}" for k in model.state_dict()]


def test_a_parameter_without_gradient_is_an_error_at_the_next_forward(one_process_group: None) -> None:
    model = mlp()
    ddp = tg.nn.parallel.DistributedDataParallel(model)
    model[0](tg.randn(2, 6)).sum().backward()  # the last layer takes no part
    with pytest.raises(tg.AutogradError, match=r"Expected to have finished reduction.*'2.weight'"):
        ddp(tg.randn(2, 6))


def test_unsupported_arguments(one_process_group: None) -> None:
    with pytest.raises(tg.UnsupportedError, match="find_unused_parameters"):
        tg.nn.parallel.DistributedDataParallel(mlp(), find_unused_parameters=True)
    with pytest.raises(tg.UnsupportedError, match="device_ids"):
        tg.nn.parallel.DistributedDataParallel(mlp(), device_ids=[0])


def test_a_compiled_step_is_traced_again_inside_no_sync(one_process_group: None) -> None:
    from tensorgraphs.codegen.loop_ir import HostCall

    model = mlp()
    ddp = tg.nn.parallel.DistributedDataParallel(model)
    x, y = tg.randn(4, 6), tg.randn(4, 3)

    @tg.compile
    def accumulate(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        model.zero_grad()
        loss = tg.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        return loss

    def host_calls() -> int:
        program = accumulate._latest.program
        return sum(isinstance(s, HostCall) for kernel in program.kernels for s in kernel.body)

    accumulate(x, y)
    assert host_calls() == 2  # one bucket: its all-reduce started and waited for
    with ddp.no_sync():
        accumulate(x, y)
        assert host_calls() == 0
    accumulate(x, y)
    assert host_calls() == 2
    assert sum(len(traces) for traces in accumulate.traces.values()) == 2
