"""One backward for every destination of a scored batch: activation gradients, split by row.

The accumulator (:meth:`~thundersync_lightning.core.accumulator.streaming.StreamingGRPO.add_tokens`) routes a
batch's rows to jobs (:mod:`~thundersync_lightning.core.accumulator.jobs`: the step's gradient, one sum per
(group, reward), one held gradient per reward-pending row). Taken one ``autograd.grad`` per job, a batch
spanning J destinations costs J backward passes over the whole batch. With a model whose rows do not
interact (a transformer with a padding mask, no batch statistics), one backward suffices:

    term_j = sum_i u_ji S_i + v_ji R_i,    d term_j / d y_i = u_ji dS_i/dy_i + v_ji dR_i/dy_i

for every activation y_i of row i, so when each row feeds one job, the backward of
T = sum_j term_j gives every row's activation gradient dy_i for its own job. A parameterised
module m computes y = f_m(x; W) row by row, so its gradient splits over rows:

    grad_W term_j = sum_{i in rows(j)} (dy_i/dW)^T dy_i

(for ``nn.Linear``: dY_j^T X_j over job j's rows; ``nn.Embedding``: dY_j added at the token ids;
any other module: the vector-Jacobian product of its own forward re-run on job j's rows).
:class:`RowCapture` records each parameterised module's input and output during the forward
(forward hooks); :func:`split_gradients` runs ``autograd.grad`` of T to the recorded outputs
(the engine then skips every weight gradient) and forms each job's gradient
(:mod:`~thundersync_lightning.backends.split.row_grads`). Rows feeding several jobs (S_i and R_i to
different places) take one such backward per job they feed.

A job whose coefficient is not known yet (a (group, reward) sum, a held row) may instead keep
its Linear and Embedding weight gradients as the factors (X_j, dY_j)
(:mod:`~thundersync_lightning.backends.split.factors`), formed in one matmul when its group folds: per
call that costs N_j (in + out) values instead of an out x in gradient per destination.

Exact up to summation order. What it cannot see (a parameter used outside its module's
forward, an in-place change of a recorded output, gradient checkpointing, rows that interact)
would make it wrong, so the first use is checked against the per-job backward and refuses a
model that fails (:attr:`RowCapture.verified`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ...core.accumulator.jobs import Grads, Job, run_jobs
from ...core.errors import ConfigError, InvalidLogprobError
from ...core.grpo.terms import TrajectoryTerms
from .factors import Chunk, Factors, chunk_of
from .row_grads import Layouts, Record, module_grads

__all__ = ["RowCapture", "split_gradients", "unsupported_modules"]


def _owned(module: nn.Module, params: set[int]) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) in params]


def unsupported_modules(model: nn.Module, params: Sequence[Tensor]) -> list[str]:
    """Why ``model`` cannot be split (empty: it can): parameters outside any module, embeddings
    whose gradient is not a plain scatter, gradient checkpointing."""
    wanted = {id(p) for p in params}
    owned: set[int] = set()
    problems: list[str] = []
    for name, module in model.named_modules():
        mine = _owned(module, wanted)
        owned.update(id(p) for _, p in mine)
        if (
            mine
            and not isinstance(module, (nn.Linear, nn.Embedding))
            and any(True for _ in module.children())
        ):
            problems.append(f"{name or 'model'}: a module with submodules owns trainable parameters")
        if (
            mine
            and isinstance(module, nn.Embedding)
            and (module.max_norm is not None or module.scale_grad_by_freq or module.sparse)
        ):
            problems.append(f"{name or 'model'}: nn.Embedding with max_norm, scale_grad_by_freq or sparse")
    missing = len(wanted - owned)
    if missing:
        problems.append(f"{missing} of the trainable parameters belong to no module of the model")
    if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        problems.append("gradient checkpointing is on (the backward re-runs the forward)")
    return problems


class RowCapture:
    """Records the parameterised modules' inputs and outputs of the forwards run inside it.

    ``with capture:`` starts a batch (records cleared, hooks on); wrap each forward of a subset
    of the batch's rows in ``capture.rows(index)`` (the batch row of each dim-0 position). Only
    forwards with autograd on are recorded (a no-grad reference forward is not).

    ``strict``: a model that fails the first-use check raises; otherwise the check's per-job
    gradients are used, :attr:`refused` says why, and callers stop splitting.
    """

    def __init__(self, model: nn.Module, params: Sequence[Tensor], *, strict: bool = True) -> None:
        problems = unsupported_modules(model, params)
        if problems:
            raise ConfigError("this model's gradients cannot be split by row: " + "; ".join(problems))
        wanted = {id(p) for p in params}
        self.modules = [m for m in model.modules() if _owned(m, wanted)]
        self._owned = {id(m): _owned(m, wanted) for m in self.modules}
        self._scale = {  # y = w * f(x) (RMSNorm-like): its gradient is sum(dy * f(x)), no VJP needed
            id(m): not isinstance(m, (nn.Linear, nn.Embedding)) and _is_scale(m, self._owned[id(m)])
            for m in self.modules
        }
        self.records: list[Record] = []
        self.strict = strict
        self.verified = False
        self.refused: str | None = None
        self._rows: tuple[int, ...] | None = None
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> RowCapture:
        if self._handles:
            raise RuntimeError("RowCapture is already recording")
        self.records = []
        self._handles = [m.register_forward_hook(self._hook, with_kwargs=True) for m in self.modules]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    @contextmanager
    def rows(self, index: Sequence[int]) -> Iterator[None]:
        self._rows = tuple(int(i) for i in index)
        try:
            yield
        finally:
            self._rows = None

    def _hook(
        self, module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: object
    ) -> None:
        if not torch.is_grad_enabled() or not isinstance(output, Tensor) or not output.requires_grad:
            return
        if self._rows is None:
            raise RuntimeError("RowCapture: a forward ran outside capture.rows(index)")
        x = args[0] if args else None
        if len(args) != 1 or kwargs or not isinstance(x, Tensor) or x.shape[:1] != output.shape[:1]:
            self._refuse(f"{type(module).__name__} is not called with one batch-first tensor")
        elif x.shape[0] != len(self._rows):
            self._refuse(f"a forward of {x.shape[0]} rows ran inside rows() of {len(self._rows)}")
        else:
            self.records.append(Record(module, x.detach(), output, self._rows))

    def _refuse(self, reason: str) -> None:
        if self.refused is None:
            self.refused = f"split backward: {reason}; turn split_backward off"

    @property
    def recording(self) -> bool:
        return bool(self._handles)

    def clear(self) -> None:
        """Drop the records (and the graph they keep alive)."""
        self.records = []

    def owned(self, module: nn.Module) -> list[tuple[str, nn.Parameter]]:
        return self._owned[id(module)]

    def is_scale(self, module: nn.Module) -> bool:
        return self._scale[id(module)]


def split_gradients(
    capture: RowCapture,
    label: object,
    jobs: Sequence[Job],
    terms: TrajectoryTerms,
    params: Sequence[Tensor],
    kept: Sequence[int] | None = None,
    factor: Sequence[bool] | None = None,
) -> tuple[list[Grads | Chunk], int]:
    """Every job's parameter gradients from the recorded forward (module docstring) and the
    number of backward passes taken; the caller clears the capture afterwards. ``kept``: the
    recorded batch row of each row of ``terms`` (rows left out of the terms feed nothing).
    ``factor``: per job, return a :class:`~thundersync_lightning.backends.split.factors.Chunk` (Linear and
    Embedding weights kept as factors, formed when the coefficient is known) instead of dense
    gradients. Checked against :func:`~thundersync_lightning.core.accumulator.jobs.run_jobs` on first use."""
    if capture.recording:
        raise RuntimeError(
            "split_gradients: leave `with capture:` (the scoring) before splitting its backward"
        )
    if capture.refused is not None:  # the forward showed a module it cannot split: one backward per job
        if capture.strict:
            raise ConfigError(capture.refused)
        return run_jobs(label, jobs, params), len(jobs)
    if not capture.records:
        raise InvalidLogprobError(
            "split_gradients: nothing was recorded; score the batch inside `with capture:`"
        )
    parts = [terms.score] + ([terms.regulariser] if terms.regulariser is not None else [])
    n = terms.score.shape[0]
    weights = _job_weights(jobs, parts)  # (J, parts, n)
    feeds: list[list[int]] = [[] for _ in range(n)]  # the jobs each row feeds
    for j, i in weights.ne(0).any(1).nonzero().tolist():
        feeds[i].append(j)
    passes = max((len(f) for f in feeds), default=0)
    reference = run_jobs(label, jobs, params, retain=True) if not capture.verified else None
    out: list[Grads] = [[None] * len(params) for _ in jobs]
    keep_factors = [False] * len(jobs) if factor is None else list(factor)
    pieces: list[dict[int, list[Factors]]] = [{} for _ in jobs]
    index = {id(p): k for k, p in enumerate(params)}
    outputs = [r.output for r in capture.records]
    width = 1 + max(max(r.rows) for r in capture.records)
    arange = torch.arange(n, device=weights.device)
    for k in range(passes):
        owner = [f[k] if len(f) > k else -1 for f in feeds]  # the job each row feeds in this pass
        by_row = [-1] * max(width, n)  # the same, by recorded batch row
        for i, j in enumerate(owner):
            by_row[kept[i] if kept is not None else i] = j
        pick = torch.tensor(owner, device=weights.device)
        coef = weights[pick.clamp(min=0), :, arange] * pick.ge(0)[:, None]  # (n, parts)
        total = sum((coef[:, m] * p).sum() for m, p in enumerate(parts))
        dys = torch.autograd.grad(total, outputs, retain_graph=k < passes - 1, allow_unused=True)
        layouts = Layouts(by_row, keep_factors, weights.device)
        for record, dy in zip(capture.records, dys):
            if dy is not None:
                module_grads(capture, index, record, dy, layouts, out, pieces)
    result: list[Grads | Chunk] = [
        chunk_of(g, pieces[j], params) if keep_factors[j] else g for j, g in enumerate(out)
    ]
    if reference is not None:
        problem = _mismatch([g.dense() if isinstance(g, Chunk) else g for g in result], reference, jobs)
        if problem is not None:
            if capture.strict:
                raise ConfigError(problem)
            capture.refused = problem
            return reference, len(jobs)
        capture.verified = True
    for j, g in enumerate(result):
        if all(p is None for p in (g.parts if isinstance(g, Chunk) else g)):
            raise InvalidLogprobError(f"job {jobs[j].destination} has no gradient in the recorded forward")
    return result, passes


def _job_weights(jobs: Sequence[Job], parts: list[Tensor]) -> Tensor:
    """(J, parts, n): each job's coefficient of every row's S_i and R_i (the tiny graph from the
    rows' terms to the job's scalar, differentiated for all jobs in one batched call)."""
    terms = torch.stack([job.term for job in jobs])
    try:
        w = torch.autograd.grad(
            terms,
            parts,
            torch.eye(len(jobs), dtype=terms.dtype, device=terms.device),
            retain_graph=True,
            allow_unused=True,
            is_grads_batched=True,
        )
    except RuntimeError:  # an op without a batching rule: one small backward per job
        w = tuple(
            torch.stack(g) if g[0] is not None else None
            for g in zip(
                *(torch.autograd.grad(job.term, parts, retain_graph=True, allow_unused=True) for job in jobs)
            )
        )  # type: ignore[misc]
    return torch.stack(
        [
            torch.zeros(len(jobs), *p.shape, dtype=p.dtype, device=p.device) if g is None else g.detach()
            for g, p in zip(w, parts)
        ],
        dim=1,
    )


def _is_scale(module: nn.Module, owned: list[tuple[str, nn.Parameter]]) -> bool:
    """Whether the module's output is its 1-D ``weight`` times a function of the input (checked on
    a random input: f(x; w) == w * f(x; 1))."""
    if [n for n, _ in owned] != ["weight"] or module.weight.dim() != 1:
        return False
    with torch.no_grad():
        x = torch.randn(2, 3, module.weight.shape[0], dtype=module.weight.dtype, device=module.weight.device)
        w = torch.rand_like(module.weight) + 0.5
        try:
            y = torch.func.functional_call(module, {"weight": w}, (x,))
            f = torch.func.functional_call(module, {"weight": torch.ones_like(w)}, (x,))
        except Exception:  # noqa: BLE001 - any failure means: not this form
            return False
        return y.shape == f.shape and bool(torch.allclose(y, w * f, rtol=1e-5, atol=1e-6))


def _mismatch(split: list[Grads], reference: list[Grads], jobs: Sequence[Job]) -> str | None:
    for job, a, b in zip(jobs, split, reference):
        for k, (ga, gb) in enumerate(zip(a, b)):
            ga = torch.zeros_like(gb) if ga is None and gb is not None else ga
            gb = torch.zeros_like(ga) if gb is None and ga is not None else gb
            if ga is None or gb is None:
                continue
            tol = 1e-4 if gb.dtype in (torch.float32, torch.float64) else 2e-2
            scale = max(float(ga.norm()), float(gb.norm()))
            err = float((ga.float() - gb.float()).norm()) / max(scale, 1e-30)
            if err > tol and scale > 1e-10:
                return (
                    f"split backward: parameter {k}'s gradient for job {job.destination} differs from the "
                    f"per-job backward by {err:.2e} (relative): this model is not split exactly by its "
                    "modules (a parameter used outside its module's forward, an in-place change of a module "
                    "output, or rows that interact); turn split_backward off"
                )
    return None
