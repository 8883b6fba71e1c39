"""A training step's device work, run eagerly or captured as CUDA graphs (train.py's `Trainer.step`).

`EagerStep` runs each micro-batch as it comes (`micro_batch`), then clips and checks the step's loss
and gradient norm on the device (`check`) and, once every rank has answered whether the step is
usable, applies AdamW or skips it (`apply`): what train.py did inline.

`CapturedStep` (`--cuda_graphs`, `graphs_decision`) takes a GPU out of the launch-bound regime: a
step of paper base on 4k-token batches of ~10-token sentences launches about 900 kernels and ran
at 4% of an H200 (docs/speed.md), its time spent launching them. Here each micro-batch shape gets
one graph of its forward, label-smoothed loss and backward (accumulating into the gradients), and
the optimizer its own: clipping, the finite check, fused AdamW told by `found_inf` on the device to
skip a non-finite step (as torch's GradScaler tells it), and the gradients zeroed in place. A step
is then one replay per micro-batch and one for the optimizer, with no host read inside them: the
one read of a step stays train.py's (`on_any_rank`), after the optimizer graph has already applied
or skipped the step by the same rule. Length buckets (dataset.py) bound the shapes, so the graphs,
each captured at its shape's first batch (that batch runs eagerly on a side stream first, then the
graph is recorded, not run), are at most one per bucket; they share one memory pool, and none runs
while another does.

Why torch.cuda.graphs rather than `torch.compile(mode="reduce-overhead")`: the latter captures what
inductor compiles, one compilation per shape (minutes each for paper base or big, against a
capture's one step here), and the optimizer and clipping outside the model as separate graphs; it
also replaces the eager kernels whose speed was measured (FlashAttention and the memory-efficient
kernel through SDPA) with its own. Not measured on a GPU yet (docs/gpu.md): benchmarks/bench_gpu.py
and gpu_check.sh measure both steps on the same batches.

Graph capture needs static tensors: each shape's inputs are copied into its own (the first batch's
own tensors), the loss's scale and the learning rate are device tensors filled before each replay,
and the gradients, once allocated by the first backward, are never set to None. The graphs are
taken only in one process (DDP's all-reduce is not captured), in bf16 or fp32 (fp16's GradScaler
reads the device to update its scale) and without --compile or --deterministic (a resumed run
captures at other steps than the unbroken one). `StandInGraphs` runs the capture and replay code
paths without CUDA: the warm-up and each replay run the recorded work eagerly (tests/test_rehearsal.py).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from config import ConfigError

Batch = dict[str, torch.Tensor]
Compute = Callable[[Batch, Any], torch.Tensor]  # a micro-batch's forward, loss and backward: its summed loss
GRAPH_DEVICES = ("cuda",)  # where captured steps run (a rehearsal adds the meta device)


def graphs_decision(config: dict[str, Any], device: torch.device, world_size: int,
                    autocast_dtype: torch.dtype | None) -> dict[str, Any] | None:
    """What `--cuda_graphs` becomes on this device: {"cuda_graphs": "on"} where auto captures (one
    CUDA process, bf16 or fp32, no --compile, no --deterministic); None where it stays as it is
    (auto on any other device or run: off). `on` where the step cannot be captured: a ConfigError."""
    obstacles = [reason for reason, present in (
        (f"a {device.type} device (CUDA only)", device.type not in GRAPH_DEVICES),
        (f"{world_size} ranks (DDP's all-reduce is not captured)", world_size > 1),
        ("fp16 (its loss scaler reads the device every step)", autocast_dtype == torch.float16),
        ("--compile (its graphs are its own)", config["compile"])) if present]
    if config["cuda_graphs"] == "on" and obstacles:
        raise ConfigError(f"--cuda_graphs on cannot capture this run's step: {obstacles[0]}")
    if config["cuda_graphs"] != "auto" or obstacles or config["deterministic"]:
        return None
    return {"cuda_graphs": "on"}


class EagerStep:
    """A step's device work as it comes (module docstring): what `CapturedStep` captures."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                 clip_grad: float, device: torch.device) -> None:
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.optimizer, self.scaler, self.device = optimizer, scaler, device
        self.clip = clip_grad or float("inf")

    def micro_batch(self, batch: Batch, scale: float, compute: Compute) -> torch.Tensor:
        """`compute` on the micro-batch moved to the device, its gradient scaled by `scale`."""
        return compute({k: v.to(self.device, non_blocking=True) for k, v in batch.items()}, scale)

    def check(self, step_loss: torch.Tensor) -> torch.Tensor:
        """Unscale and clip the step's gradients; whether the loss or the gradient norm is not finite
        (a device tensor: a non-finite norm is exactly the fp16 scaler's overflow, its found_inf)."""
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.clip)
        return ~(torch.isfinite(step_loss) & torch.isfinite(grad_norm))

    def apply(self, nonfinite: bool) -> None:
        """AdamW's step unless any rank saw a non-finite one (optimizer.step(): scaler.step() would
        read found_inf back a second time); the fp16 scale's update; the gradients freed."""
        if not nonfinite:
            self.optimizer.step()
        self.scaler.update()  # on the device: halves the scale after an overflow
        self.optimizer.zero_grad(set_to_none=True)


class CudaGraphs:
    """torch.cuda's graphs: warm-up on a side stream, capture into one shared pool, replay."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def warm_up(self, work: Callable[[], Any]) -> Any:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            result = work()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.empty_cache()  # the warm-up's blocks, which the graph's pool would otherwise hold beside its own
        return result

    def capture(self, work: Callable[[], Any]) -> "CapturedGraph":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = work()
        return CapturedGraph(graph.replay, output)


class CapturedGraph:
    """A recorded graph: `replay()` runs it again, rewriting `output` (the work's result) in place."""

    def __init__(self, replay: Callable[[], None], output: Any) -> None:
        self.replay, self.output = replay, output


class StandInGraphs:
    """The capture and replay paths without CUDA: the warm-up runs the work, the capture records it
    without running it, and each replay runs it and keeps its result as the output."""

    def __init__(self) -> None:
        self.captured = self.replayed = 0

    def warm_up(self, work: Callable[[], Any]) -> Any:
        return work()

    def capture(self, work: Callable[[], Any]) -> CapturedGraph:
        self.captured += 1
        graph = CapturedGraph(lambda: None, None)

        def replay() -> None:
            self.replayed += 1
            graph.output = work()

        graph.replay = replay
        return graph


class CapturedStep(EagerStep):
    """The step as CUDA graphs (module docstring): one per micro-batch shape, one for the optimizer.
    The optimizer must be fused AdamW where it is to skip a step inside its graph (CUDA, CPU)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                 clip_grad: float, device: torch.device, graphs: CudaGraphs | StandInGraphs) -> None:
        super().__init__(model, optimizer, scaler, clip_grad, device)
        self.graphs = graphs
        self.micro: dict[tuple, tuple[CapturedGraph, Batch, torch.Tensor]] = {}
        self.step_graph: CapturedGraph | None = None
        self.step_loss = torch.zeros((), device=device)
        # In the dtype fused AdamW reads a tensor learning rate in: CUDA's kernel an fp32 one (so its
        # step may differ from the eager one's in the last bits), the CPU's a double (bit for bit).
        rate_dtype = torch.float32 if device.type == "cuda" else torch.float64
        self.learning_rates = [torch.zeros((), dtype=rate_dtype, device=device) for _ in optimizer.param_groups]

    def micro_batch(self, batch: Batch, scale: float, compute: Compute) -> torch.Tensor:
        """The summed loss of the micro-batch: its shape's graph replayed on it (valid until the next
        replay), or, at the shape's first batch, computed eagerly and the graph captured."""
        shape = tuple((key, tuple(value.shape)) for key, value in sorted(batch.items()))
        if shape not in self.micro:
            static = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            static_scale = torch.full((), scale, device=self.device)
            summed = self.graphs.warm_up(lambda: compute(static, static_scale))
            gradients = [p.grad for p in self.parameters]
            self.micro[shape] = (self.graphs.capture(lambda: compute(static, static_scale)), static, static_scale)
            if any(p.grad is not g for p, g in zip(self.parameters, gradients)):
                raise RuntimeError("a captured backward replaced a gradient instead of accumulating into it")
            return summed
        graph, static, static_scale = self.micro[shape]
        for key, value in batch.items():
            static[key].copy_(value, non_blocking=True)
        static_scale.fill_(scale)
        graph.replay()
        return graph.output

    def check(self, step_loss: torch.Tensor) -> torch.Tensor:
        """The optimizer's graph on the step's loss at the schedule's learning rate: clipping, the
        check, and AdamW applied or skipped by it on the device; returns the check."""
        self.step_loss.copy_(step_loss)
        for rate, group in zip(self.learning_rates, self.optimizer.param_groups):
            rate.fill_(group["lr"])
        if self.step_graph is None:
            nonfinite = self.graphs.warm_up(self.optimizer_work)
            self.step_graph = self.graphs.capture(self.optimizer_work)
            return nonfinite
        self.step_graph.replay()
        return self.step_graph.output

    def optimizer_work(self) -> torch.Tensor:
        """What the optimizer's graph holds: clipping, the check, AdamW told to skip by it, and the
        gradients zeroed in place (the graphs accumulate into these very tensors)."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.clip)
        nonfinite = ~(torch.isfinite(self.step_loss) & torch.isfinite(grad_norm))
        if self.optimizer.defaults.get("fused"):
            with self.device_settings(nonfinite):
                self.optimizer.step()
        else:  # torch's other AdamW (the meta device's in a rehearsal) takes no found_inf: it steps
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        return nonfinite

    @contextlib.contextmanager
    def device_settings(self, nonfinite: torch.Tensor) -> Iterator[None]:
        """Fused AdamW reading its learning rates and whether to skip (`found_inf`, as torch's
        GradScaler sets it) from device tensors, and allowed to be captured; only inside the optimizer's
        work: the schedule, the checkpoints and the log keep reading numbers."""
        groups = self.optimizer.param_groups
        saved = [(group["lr"], group["capturable"]) for group in groups]
        for group, rate in zip(groups, self.learning_rates):
            group.update(lr=rate, capturable=True)
        self.optimizer.found_inf = nonfinite.float()
        try:
            yield
        finally:
            for group, (rate, capturable) in zip(groups, saved):
                group.update(lr=rate, capturable=capturable)
            del self.optimizer.found_inf

    def apply(self, nonfinite: bool) -> None:
        """Nothing left to do: the optimizer's graph applied or skipped the step by the same rule."""


def training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                  config: dict[str, Any], device: torch.device) -> EagerStep:
    """The run's step: captured where `cuda_graphs` is on (graphs_decision), eager otherwise."""
    if config["cuda_graphs"] != "on":
        return EagerStep(model, optimizer, scaler, config["clip_grad"], device)
    graphs = CudaGraphs() if device.type == "cuda" else StandInGraphs()
    return CapturedStep(model, optimizer, scaler, config["clip_grad"], device, graphs)
