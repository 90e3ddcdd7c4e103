"""Scaling-law fits: the loss as a power law of the model size, and of the size and the tokens seen.

  fit_power_law(N, L)               L(N) = E + A N^-alpha (Kaplan et al. 2020: alpha_N about 0.076 for
                                    non-embedding N, with enough data)
  fit_chinchilla(N, D, L)           L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022, approach 3)
  isoflop_minima(N, C, L)           the loss-minimising size per FLOP budget C, and N_opt ~ C^a (approach 2)
  bootstrap(...)                    confidence intervals by resampling the seeds of each point (Besiroglu et
                                    al. 2024 redid approach 3 so)

Both power laws are fitted as Chinchilla fits approach 3: the Huber loss (delta 1e-3) of the log of the
prediction against the log of the loss, minimised from every point of a grid of initialisations, the best
kept. Parameters are fitted as logs (A = exp(a), E = exp(e)), so A and E stay positive.
"""

import dataclasses
import itertools

import numpy as np
from scipy import optimize, special

from lm.errors import UserError

# The model-size axis of lm sweep (lm/cli/sweep.py size_overrides) and the config keys it sets.
SIZE_AXIS = "size"  # the pseudo-key of a model-size axis: WIDTHxDEPTH or a name of NAMED_SIZES
NAMED_SIZES = {  # name: (width, depth, heads), the published models' shapes
    "gpt2": (768, 12, 12), "gpt2-medium": (1024, 24, 16), "gpt2-large": (1280, 36, 20), "gpt2-xl": (1600, 48, 25),
    "pythia-14m": (128, 6, 4), "pythia-70m": (512, 6, 8), "pythia-160m": (768, 12, 12),
    "pythia-410m": (1024, 24, 16), "pythia-1b": (2048, 16, 8), "pythia-1.4b": (2048, 24, 16),
}
SIZE_KEYS = ("model.embed_dim", "model.num_layers", "model.num_heads", "model.num_kv_heads", "model.mlp_hidden_dim")

HUBER_DELTA = 1e-3  # Chinchilla's
MIN_SIZES = 3  # distinct model sizes a fit needs: three parameters
CONFIDENCE = 0.95  # the bootstrap intervals' coverage

# The grid of initialisations: each exponent from EXPONENTS, E from E_SHARES of the lowest loss, and each power
# term's coefficient such that the term makes up its share of the rest of the loss at the smallest N (and D).
EXPONENTS = (0.1, 0.3, 0.8)
E_SHARES = (0.1, 0.5, 0.9)


@dataclasses.dataclass
class Fit:
    """Fitted parameters {name: value} (E, A, alpha; approach 3: B, beta as well), and per parameter its
    bootstrap interval (low, high) where there was one to draw."""
    params: dict[str, float]
    intervals: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    def __call__(self, n, d=None) -> np.ndarray:
        """The fitted loss at sizes n (and, for approach 3, tokens d)."""
        p, n = self.params, np.asarray(n, np.float64)
        loss = p["E"] + p["A"] * n ** -p["alpha"]
        return loss if d is None else loss + p["B"] * np.asarray(d, np.float64) ** -p["beta"]


def _residuals(log_l: np.ndarray, power_terms: list[tuple[int, int, np.ndarray]], constant: int, size: int):
    """log(prediction) - log_l and its Jacobian, as functions of x (a parameter vector of length size), for a
    prediction that is a sum of power terms exp(x[c] - x[k] log v) (power_terms: (c, k, log v)) and
    exp(x[constant])."""
    def terms(x: np.ndarray) -> np.ndarray:
        return np.array([x[c] - x[k] * log_v for c, k, log_v in power_terms] + [np.full_like(log_l, x[constant])])

    def residuals(x: np.ndarray) -> np.ndarray:
        return special.logsumexp(terms(x), axis=0) - log_l

    def jacobian(x: np.ndarray) -> np.ndarray:
        t = terms(x)
        weights = np.exp(t - special.logsumexp(t, axis=0))  # d prediction / d term
        jac = np.zeros((len(log_l), size))
        for weight, (c, k, log_v) in zip(weights, power_terms, strict=False):
            jac[:, c] += weight
            jac[:, k] -= weight * log_v
        jac[:, constant] += weights[-1]
        return jac

    return residuals, jacobian


def _fit_from_starts(residuals, starts: list[np.ndarray]) -> np.ndarray:
    """The minimum of the Huber loss (delta HUBER_DELTA) of the residuals over the parameter vector, from every one
    of starts: the best result's x. (scipy's trust-region least squares with a Huber loss: Chinchilla minimised the
    same loss by L-BFGS, which crawls at so small a delta.)"""
    function, jacobian = residuals
    best = None
    for start in starts:
        result = optimize.least_squares(function, start, jac=jacobian, loss="huber", f_scale=HUBER_DELTA,
                                         x_scale="jac")
        if np.isfinite(result.cost) and (best is None or result.cost < best.cost):
            best = result
    return best.x


def _grid(loss: np.ndarray, smallest: list[float]) -> list[np.ndarray]:
    """Initial parameter vectors (log coefficients..., e, exponents...) for a sum of len(smallest) power terms
    of the variables whose smallest values are smallest, and E."""
    starts = []
    for share in E_SHARES:
        rest = (loss.max() - share * loss.min()) / len(smallest)
        for exponents in itertools.product(EXPONENTS, repeat=len(smallest)):
            logs = [np.log(rest) + k * np.log(v) for k, v in zip(exponents, smallest, strict=True)]
            starts.append(np.array([*logs, np.log(share * loss.min()), *exponents]))
    return starts


def fit_power_law(n, loss, starts: list[np.ndarray] | None = None) -> Fit:
    """L(N) = E + A N^-alpha fitted to the points (n[i], loss[i]) (seeds of a size as separate points): a
    UserError for fewer than MIN_SIZES distinct sizes."""
    n, loss = np.asarray(n, np.float64), np.asarray(loss, np.float64)
    check_sizes(n)
    residuals = _residuals(np.log(loss), [(0, 2, np.log(n))], 1, 3)  # x = (a, e, alpha)
    a, e, alpha = _fit_from_starts(residuals, starts or _grid(loss, [n.min()]))
    return Fit({"E": float(np.exp(e)), "A": float(np.exp(a)), "alpha": float(alpha)})


def check_sizes(n: np.ndarray, what: str = "a fit of L(N)") -> None:
    sizes = np.unique(n)
    if len(sizes) < MIN_SIZES:
        shown = ", ".join(f"{s:,.0f}" for s in sizes)
        raise UserError(f"{what} needs runs of {MIN_SIZES} or more model sizes; these have {len(sizes)} "
                        f"(N = {shown}): add sizes to the sweep's size axis")


def fit_chinchilla(n, d, loss, starts: list[np.ndarray] | None = None) -> Fit:
    """Approach 3 of Hoffmann et al. 2022: L(N, D) = E + A / N^alpha + B / D^beta fitted to the points
    (n[i], d[i], loss[i]). Also the compute-optimal exponents it implies (C ~ N D): N_opt ~ C^a with
    a = beta / (alpha + beta), D_opt ~ C^b with b = alpha / (alpha + beta)."""
    n, d, loss = (np.asarray(v, np.float64) for v in (n, d, loss))
    check_sizes(n, "approach 3")
    residuals = _residuals(np.log(loss), [(0, 3, np.log(n)), (1, 4, np.log(d))], 2, 5)  # (a, b, e, alpha, beta)
    a, b, e, alpha, beta = _fit_from_starts(residuals, starts or _grid(loss, [n.min(), d.min()]))
    return Fit({"E": float(np.exp(e)), "A": float(np.exp(a)), "alpha": float(alpha), "B": float(np.exp(b)),
                "beta": float(beta), "a": float(beta / (alpha + beta)), "b": float(alpha / (alpha + beta))})


def _start(fit: Fit) -> np.ndarray:
    """The parameter vector of a fit, to start a bootstrap refit from."""
    p = fit.params
    logs = [np.log(p["A"])] + ([np.log(p["B"])] if "B" in p else []) + [np.log(p["E"]), p["alpha"]]
    return np.array(logs + ([p["beta"]] if "B" in p else []))


def bootstrap(fit: Fit, points: list[tuple], refit, samples: int = 1000, seed: int = 0) -> Fit:
    """fit with bootstrap intervals: points are (x..., losses over seeds) per distinct size (and token count);
    each sample draws every point's seeds with replacement and refits (refit(xs..., losses, starts)) from fit's
    parameters; the intervals are the central CONFIDENCE share of the refits' values. Points of one seed
    each give no interval (fit returned as it is)."""
    if samples < 1 or all(len(p[-1]) < 2 for p in points):
        return fit
    rng = np.random.default_rng(seed)
    start = [_start(fit)]
    draws = []
    for _ in range(samples):
        columns = [[] for _ in range(len(points[0]))]
        for *xs, losses in points:
            chosen = rng.choice(losses, size=len(losses), replace=True)
            for column, x in zip(columns[:-1], xs, strict=True):
                column.extend([x] * len(chosen))
            columns[-1].extend(chosen)
        draws.append(refit(*columns, starts=start).params)
    tail = (1 - CONFIDENCE) / 2 * 100
    intervals = {key: tuple(float(v) for v in np.percentile([d[key] for d in draws], [tail, 100 - tail]))
                 for key in fit.params}
    return Fit(fit.params, intervals)


@dataclasses.dataclass
class IsoFlop:
    """Approach 2: per FLOP budget C, the parabola of loss against log N and its minimum (N_opt, L_min);
    then N_opt = k C^a fitted over the budgets (a None with fewer than two minima)."""
    budgets: list[dict]  # {"C": ..., "N": [...], "L": [...], "parabola": (p2, p1, p0), "N_opt": ..., "L_min": ...}
    a: float | None
    k: float | None


def isoflop_minima(n, flops, loss, num_budgets: int = 6) -> IsoFlop:
    """Approach 2 of Hoffmann et al. 2022 from runs at several token counts per size: num_budgets FLOP
    budgets, log-spaced over the runs' FLOPs; at each, every size whose runs span it gives its loss there
    (interpolated linearly in log C between its runs, the mean over seeds), and with three or more sizes a
    parabola in log N gives the loss-minimising size (kept when the minimum lies within the sizes). Then
    log N_opt = a log C + log k, fitted by least squares over the budgets."""
    n, flops, loss = (np.asarray(v, np.float64) for v in (n, flops, loss))
    check_sizes(n, "IsoFLOP minima")
    curves = {}
    for size in np.unique(n):
        mine = n == size
        cs = np.unique(flops[mine])
        curves[size] = (np.log(cs), np.array([loss[mine & (flops == c)].mean() for c in cs]))
    budgets = []
    for log_c in np.linspace(np.log(flops.min()), np.log(flops.max()), num_budgets):
        spanned = {size: float(np.interp(log_c, xs, ys)) for size, (xs, ys) in curves.items()
                   if xs[0] - 1e-9 <= log_c <= xs[-1] + 1e-9}
        if len(spanned) < MIN_SIZES:
            continue
        sizes, losses = np.array(list(spanned)), np.array(list(spanned.values()))
        p2, p1, p0 = np.polyfit(np.log(sizes), losses, 2)
        budget = {"C": float(np.exp(log_c)), "N": sizes.tolist(), "L": losses.tolist(),
                  "parabola": (float(p2), float(p1), float(p0))}
        if p2 > 0 and np.log(sizes.min()) <= -p1 / (2 * p2) <= np.log(sizes.max()):
            x = -p1 / (2 * p2)
            budget.update(N_opt=float(np.exp(x)), L_min=float(p0 + p1 * x + p2 * x * x))
        budgets.append(budget)
    minima = [b for b in budgets if "N_opt" in b]
    if len(minima) < 2:
        return IsoFlop(budgets, None, None)
    a, log_k = np.polyfit(np.log([b["C"] for b in minima]), np.log([b["N_opt"] for b in minima]), 1)
    return IsoFlop(budgets, float(a), float(np.exp(log_k)))
