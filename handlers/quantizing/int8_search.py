"""Which linears `quantize: int8` leaves in floating point: the fewest whose int8 would take the
answers past the gate (issue 57's "sensitive layers kept in bfloat16").

int8 is simulated on the float32 model: each linear's input quantized per tensor to 8 bits with its
own range (what the dynamic int8 kernels do per call), its weight per output channel, both after
SmoothQuant's scale, their product summed in float32; the rest runs at the model's dtype (bfloat16
under autocast, whose rounding adds to int8's). It reads what the real int8 model reads to the third
decimal or better (docs/performance.md, "Keeping only the sensitive linears in floating point"), at
one float32 pass over the calibration texts per try instead of an export and a quantization. The
real gate still judges the model the search picks, eager and compiled.

The search: every linear quantized alone, ranked by how far it moves the texts int8 moves most (a
linear that moves nothing, BERT's pooler under mean pooling, is out of the count); then the fewest
of the top-ranked kept in floating point that let the rest pass the gate with MARGIN of its allowance
in hand, by bisection up to MOST_KEPT of the weights (it takes keeping more as never worse: near
enough, not exact). Past MOST_KEPT the model is refused: its int8 would not pay.
"""

import contextlib
import logging
import time

import torch

from ts_compiled_handlers.engine.engine import Engine
from ts_compiled_handlers.quantizing import quantizing

logger = logging.getLogger(__name__)

# The share of the gate's allowance (1 - floor) the simulated model keeps in hand, for the compiled
# model's own rounding: on MiniLM the compiled gate read 0.0022 below the eager one (0.9898 against 0.9920).
MARGIN = 0.3
RANKING_ROWS = 10  # the calibration texts the ranking runs on: those int8 moves most
# The largest share of the weights that may stay in floating point: MiniLM with its residual
# projections kept (42%) ran 1.17-1.24x bfloat16's speed at 8x64, with none kept 1.36-1.44x.
MOST_KEPT = 1 / 3
EPS = 2**-12  # the least scale, as torchao's x86 observers have it


def _input_in_int8(x: torch.Tensor, top: int) -> torch.Tensor:
    """`x` through per-tensor affine quantization to [0, top], as the dynamic kernels do per call."""
    low, high = x.min().clamp(max=0), x.max().clamp(min=0)
    scale = ((high - low) / top).clamp(min=EPS)
    zero = torch.round(-low / scale)
    return (torch.clamp(torch.round(x / scale) + zero, 0, top) - zero) * scale


def _weight_in_int8(weight: torch.Tensor) -> torch.Tensor:
    """`weight` through per-output-channel symmetric quantization to [-128, 127]."""
    scale = (weight.abs().amax(1, keepdim=True) / 127.5).clamp(min=EPS)
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

    with contextlib.ExitStack() as hooks:  # each removed on exit, also if a later one fails to register
        for name in names:
            hooks.callback(in_int8(name).remove)
        yield


def _relative_errors(rows: list[torch.Tensor], reference: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(
        [(a.float() - b).pow(2).sum() / b.pow(2).sum().clamp(min=1e-12) for a, b in zip(rows, reference, strict=True)]
    )


class _Simulation:
    """The float32 engine answering the gate's rows with the named linears simulated in int8 and the
    rest at `dtype`."""

    def __init__(self, engine: Engine, gate: quantizing.Int8Gate, scales: dict[str, torch.Tensor], top: int, dtype):
        self.engine, self.gate, self.scales, self.top, self.dtype = engine, gate, scales, top, dtype

    def answers(self, quantized, rows: list[int] | None = None) -> list[torch.Tensor]:
        around = torch.autocast(self.engine.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)
        with simulated(self.engine.model.eager, self.scales, quantized, self.top), around:
            return self.gate.answers(self.engine, rows)

    def gate_figures(self, rows: list[torch.Tensor]) -> quantizing.GateFigures:
        return quantizing.figures(self.gate.labels, rows, self.gate.reference, self.gate.floors)

    def ranked(self, names: list[str], all_int8: list[torch.Tensor]) -> list[str]:
        """The linears whose int8 moves the answers at all, the one that alone moves most first the
        rows that int8 of all (`all_int8`: its answers) moves most (moves: from the answers at `dtype`
        with no linear in int8)."""
        errors = _relative_errors(all_int8, self.gate.reference)
        worst = errors.argsort(descending=True)[:RANKING_ROWS].tolist()
        unquantized = self.answers([], worst)
        harm = {name: _relative_errors(self.answers([name], worst), unquantized).mean().item() for name in names}
        return sorted((name for name in names if harm[name] > 0), key=harm.get, reverse=True)


def clears(found: quantizing.GateFigures) -> bool:
    """Whether simulated figures clear the gate's floor by MARGIN of its allowance."""
    return found.value >= found.floor + (1 - found.floor) * MARGIN


def kept_in_float(
    engine: Engine, gate: quantizing.Int8Gate, scales: dict[str, torch.Tensor], top: int, dtype
) -> tuple[str, ...]:
    """The fewest of the linears in `scales` to keep in floating point so that int8 of the others
    passes `gate` (holding float32's answers), run on the float32 `engine` with the rest at `dtype`
    (bfloat16 under autocast, as quantizing.AroundInt8 runs it: its rounding adds to int8's);
    quantizing.QuantizationRefused where that keeps more than MOST_KEPT of their weights."""
    began, simulation = time.perf_counter(), _Simulation(engine, gate, scales, top, dtype)
    all_int8 = simulation.answers(list(scales))
    every = simulation.gate_figures(all_int8)
    if clears(every):
        logger.info("int8: every linear in int8 passes the gate, simulated (%s)", every)
        return ()
    ranked = simulation.ranked(list(scales), all_int8)
    weights = [engine.model.eager.get_submodule(name).weight.numel() for name in ranked]
    shares = torch.tensor(weights, dtype=torch.float64).cumsum(0) / sum(weights)  # kept: the first k+1
    most = int((shares <= MOST_KEPT).sum())  # the most that may be kept
    found = simulation.gate_figures(simulation.answers(ranked[most:]))
    if not clears(found):
        raise quantizing.QuantizationRefused(
            f"int8 vs float32: {every}; with the {most} of {len(ranked)} linears that hurt most kept in floating "
            f"point (up to {MOST_KEPT:.0%} of the weights) it reads {found.value:.4f} simulated: int8 would not pay"
        )
    fewest = 0  # int8 of all fails
    while most - fewest > 1:  # bisect: the fewest kept that passes
        middle = (fewest + most) // 2
        figures = simulation.gate_figures(simulation.answers(ranked[middle:]))
        fewest, most, found = (fewest, middle, figures) if clears(figures) else (middle, most, found)
    share = float(shares[most - 1]) if most else 0.0
    logger.info(
        "int8: %d of %d linears kept in floating point (%.1f%% of their weights), the fewest for the rest to "
        "pass (simulated: %.4f), found in %.1fs",
        *(most, len(ranked), 100 * share, found.value, time.perf_counter() - began),
    )
    return tuple(ranked[:most])


def sensitive_linears(engine: Engine, gate: quantizing.Int8Gate, ranges: dict, alpha: float, dtype) -> tuple[str, ...]:
    """The linears `quantize: int8` keeps in floating point, each simulated with the smoothing it
    would get at `alpha` (0: none), the rest run at `dtype`."""
    quantizing.check_fit(engine, dtype)
    module = engine.model.eager
    scales = {
        name: quantizing.smoothing_scale(module.get_submodule(name).weight, seen, alpha)
        if alpha
        else torch.ones_like(seen)
        for name, seen in ranges.items()
    }
    return kept_in_float(engine, gate, scales, 255 if quantizing.has_vnni() else 127, dtype)
