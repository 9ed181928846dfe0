"""Which linears `quantize: int8` leaves in floating point: the fewest whose int8 would take the
answers past the gate (issue 57's "sensitive layers kept in bfloat16").

int8 is simulated on the float32 model: each linear's input quantized per tensor to 8 bits with its
own range (what the dynamic int8 kernels do per call), its weight per output channel, both after
SmoothQuant's scale, their product summed in float32; the rest runs at the model's dtype (bfloat16
under autocast, whose rounding adds to int8's). On MiniLM the simulated gate read 0.9936 where the
int8 model it picked read 0.9932 (every linear simulated in float32 alone: 0.98731 against 0.98740):
close enough to search with, at one float32 pass over the calibration texts per try instead of an
export and a quantization. The real gate still judges the model the search picks, eager and compiled.

The search: every linear quantized alone, ranked by how far it moves the texts int8 moves most; then
the fewest of the top-ranked kept in floating point that let the rest pass the gate with MARGIN of
its allowance in hand (a bisection, which takes keeping more as never worse: near enough, not
exact). On MiniLM that is three linears of 36, the FFN downs of layers 0-2 (16% of the weights),
where the fixed recipe kept all twelve residual projections (41%). A model that passes only with
more than MOST_KEPT of its weights kept is refused: its int8 would not pay.
"""

import contextlib
import logging
import time

import torch

from ts_compiled_handlers.engine.engine import Engine

logger = logging.getLogger(__name__)

# The share of the gate's allowance (1 - floor) the simulated model keeps in hand, for the compiled
# model's own rounding: on MiniLM the compiled gate read 0.0022 below the eager one (0.9898 against 0.9920).
MARGIN = 0.3
RANKING_ROWS = 10  # the calibration texts the ranking runs on: those int8 moves most
# The largest share of the weights that may stay in floating point: MiniLM with its residual
# projections kept (42%) ran 1.17-1.24x bfloat16's speed at 8x64, with none kept 1.36-1.44x.
MOST_KEPT = 1 / 3


def _input_in_int8(x: torch.Tensor, top: int) -> torch.Tensor:
    """`x` through per-tensor affine quantization to [0, top], as the dynamic kernels do per call."""
    low, high = x.min().clamp(max=0), x.max().clamp(min=0)
    scale = ((high - low) / top).clamp(min=torch.finfo(torch.float32).eps)
    zero = torch.round(-low / scale)
    return (torch.clamp(torch.round(x / scale) + zero, 0, top) - zero) * scale


def _weight_in_int8(weight: torch.Tensor) -> torch.Tensor:
    """`weight` through per-output-channel symmetric quantization to [-128, 127]."""
    scale = (weight.abs().amax(1, keepdim=True) / 127.5).clamp(min=torch.finfo(torch.float32).eps)
    return torch.clamp(torch.round(weight / scale), -128, 127) * scale


@contextlib.contextmanager
def simulated(module: torch.nn.Module, scales: dict[str, torch.Tensor], names, top: int):
    """While open, the linears in `names` answer as their int8 would (`scales`: each one's smoothing
    scale per input channel, ones where unsmoothed; `top`: 255, or 127 for 7-bit activations)."""

    def in_int8(name: str):
        linear = module.get_submodule(name)
        scale = scales[name]
        weight = _weight_in_int8(linear.weight.detach().float() * scale)

        def answer(_, args, output):
            with torch.autocast(args[0].device.type, enabled=False):  # int8 products sum exactly: float32
                inputs = _input_in_int8(args[0].float() / scale, top)
                return torch.nn.functional.linear(inputs, weight, linear.bias).to(output.dtype)

        return linear.register_forward_hook(answer)

    hooks = [in_int8(name) for name in names]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def _relative_errors(rows: list[torch.Tensor], reference: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(
        [(a.float() - b).pow(2).sum() / b.pow(2).sum().clamp(min=1e-12) for a, b in zip(rows, reference, strict=True)]
    )


class _Simulation:
    """The float32 engine answering the gate's rows with the named linears simulated in int8 and the
    rest at `dtype`; `read`: what the simulated gate read, by how many linears were kept."""

    def __init__(self, engine: Engine, gate, scales: dict[str, torch.Tensor], top: int, dtype):
        self.engine, self.gate, self.scales, self.top, self.dtype = engine, gate, scales, top, dtype
        self.read: dict[int, float] = {}

    def answers(self, quantized, rows: list[int] | None = None) -> list[torch.Tensor]:
        rows = range(len(self.gate.rows)) if rows is None else rows
        around = torch.autocast(self.engine.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)
        with simulated(self.engine.model.eager, self.scales, quantized, self.top), around:
            return self.engine.run([self.gate.rows[row] for row in rows]).rows

    def figures(self, rows: list[torch.Tensor]):
        from ts_compiled_handlers.startup import quantizing

        return quantizing.figures(self.gate.task_name, rows, self.gate.reference, self.gate.tolerance)

    def passes(self, rows: list[torch.Tensor], kept: int) -> bool:
        """Whether answers with `kept` linears kept clear the gate's floor by MARGIN of its allowance."""
        found = self.figures(rows)
        self.read[kept] = found.value
        return found.value >= found.floor + (1 - found.floor) * MARGIN

    def ranked(self, names: list[str], all_int8: list[torch.Tensor]) -> list[str]:
        """The linears, the one whose int8 alone moves most the rows all-int8 moves most first."""
        worst = _relative_errors(all_int8, self.gate.reference).argsort(descending=True)[:RANKING_ROWS].tolist()
        reference = [self.gate.reference[row] for row in worst]
        harm = {name: _relative_errors(self.answers([name], worst), reference).mean().item() for name in names}
        return sorted(names, key=harm.get, reverse=True)


def kept_in_float(engine: Engine, gate, scales: dict[str, torch.Tensor], top: int, dtype) -> tuple[str, ...]:
    """The fewest of the linears in `scales` to keep in floating point so that int8 of the others
    passes `gate` (quantizing.Int8Gate, holding float32's answers), run on the float32 `engine` with
    the rest at `dtype` (bfloat16 under autocast, as quantizing.AroundInt8 runs it: its rounding
    adds to int8's); quantizing.QuantizationRefused where that keeps more than MOST_KEPT of their
    weights."""
    from ts_compiled_handlers.startup import quantizing

    began, names = time.perf_counter(), list(scales)
    simulation = _Simulation(engine, gate, scales, top, dtype)
    all_int8 = simulation.answers(names)
    if simulation.passes(all_int8, 0):
        return ()
    ranked = simulation.ranked(names, all_int8)
    fewest, most = 0, len(ranked)  # int8 of all fails; keeping every one is float32 itself
    while most - fewest > 1:  # bisect: the fewest kept that passes
        middle = (fewest + most) // 2
        passed = simulation.passes(simulation.answers(ranked[middle:]), middle)
        fewest, most = (fewest, middle) if passed else (middle, most)
    kept = ranked[:most]
    weights = {name: engine.model.eager.get_submodule(name).weight.numel() for name in names}
    share = sum(weights[name] for name in kept) / sum(weights.values())
    if share > MOST_KEPT:
        raise quantizing.QuantizationRefused(
            f"int8 vs float32: {simulation.figures(all_int8)}; it passes only with {len(kept)} of {len(names)} "
            f"linears ({share:.0%} of their weights) kept in floating point, too few left to gain"
        )
    logger.info(
        "int8: %d of %d linears kept in floating point (%.1f%% of their weights), the fewest for the rest to "
        "pass (simulated: %.4f), found in %.1fs",
        *(len(kept), len(names), 100 * share, simulation.read.get(len(kept), 1.0), time.perf_counter() - began),
    )
    return tuple(kept)
