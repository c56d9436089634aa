"""A training step replayed as a CUDA graph (PyTorch's "whole-network capture"): one launch
instead of the step's thousands of kernels (an outer step of `mi_backprop` is ~5,000).

A captured step may do only CUDA work on tensors that keep their memory, draw only from
generators named here (registered, so each replay draws anew), never sync with the host, and
keep no Python state that changes between calls (a replay does not advance it). A capture
that fails leaves the step eager for good; `failure` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# Eager calls of a shape before its capture: the first call's lazy work (optimiser state,
# cuBLAS workspaces, allocator pools) must not happen inside a capture.
WARMUP_CALLS = 3


class _Captured:
    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: tuple[torch.Tensor, ...],
                 outputs: tuple[torch.Tensor, ...]) -> None:
        self.graph, self.inputs, self.outputs = graph, inputs, outputs


class GraphedStep:
    """Captured per input shape after `warmup` eager calls; `generators`: all it draws from."""

    def __init__(self, step: Callable[..., tuple[torch.Tensor, ...]],
                 generators: Sequence[torch.Generator] = (), warmup: int = WARMUP_CALLS) -> None:
        self.step = step
        self.generators = list(generators)
        self.warmup = warmup
        self.failure: str | None = None
        self._told = False
        self.replays = 0
        self._calls: dict[tuple, int] = {}
        self._graphs: dict[tuple, _Captured] = {}
        self._side: torch.cuda.Stream | None = None

    @property
    def graphed(self) -> bool:
        return self.failure is None and bool(self._graphs)

    def in_use(self, who: str) -> bool:
        """Whether the steps replay a graph; a failed capture is said once."""
        if self.failure is not None and not self._told:
            print(f"cuda graphs: capture failed ({self.failure}): this {who} runs eager",
                  flush=True)
            self._told = True
        return self.graphed

    def reset(self) -> None:
        """Drop every graph: the step's Python-side path changed."""
        self._graphs.clear()
        self._calls.clear()

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.failure is not None:
            return self.step(*inputs)
        key = tuple((t.shape, t.dtype, t.stride(), t.device) for t in inputs)
        captured = self._graphs.get(key)
        if captured is None:
            calls = self._calls.get(key, 0)
            self._calls[key] = calls + 1
            if calls < self.warmup:
                return self._eager_on_side_stream(inputs)
            try:
                captured = self._capture(inputs)
            except Exception as exc:  # any failure: the step goes on eager, and says why
                self.failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
                self._graphs.clear()
                torch.cuda.synchronize()
                return self.step(*inputs)
            self._graphs[key] = captured
        else:
            for static, new in zip(captured.inputs, inputs, strict=True):
                static.copy_(new)
        captured.graph.replay()
        self.replays += 1
        # The next replay overwrites the outputs.
        return tuple(out.clone() for out in captured.outputs)

    def _eager_on_side_stream(self, inputs: tuple[torch.Tensor, ...]
                              ) -> tuple[torch.Tensor, ...]:
        # Warm-up runs on a side stream, as the capture will (PyTorch's notes: the lazy
        # state autograd keeps per stream must be made there).
        if self._side is None:
            self._side = torch.cuda.Stream()
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            outputs = self.step(*inputs)
        torch.cuda.current_stream().wait_stream(self._side)
        return outputs

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> _Captured:
        graph = torch.cuda.CUDAGraph()
        for gen in self.generators:
            graph.register_generator_state(gen)
        static = tuple(t.clone() for t in inputs)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            outputs = self.step(*static)
        return _Captured(graph, static, tuple(outputs))


def graph_obstacles(device: torch.device, conditions: dict[str, bool]) -> list[str]:
    """Why a step cannot be captured here: not CUDA, or each reason in `conditions` that holds."""
    reasons = [] if device.type == "cuda" else [f"the device is {device.type}, not cuda"]
    return reasons + [reason for reason, holds in conditions.items() if holds]
