"""Interactive views for notebooks 02, 03 and 05: sliders wired to pure functions (specref.course.plots, record_generation).

Each widget is an ipywidgets box that keeps its parts as attributes, so a test can
move a slider and read the result without a browser: the sliders, `summary` (an
HTML widget holding the numbers as text) and `figure` (an Image widget holding
the plot as PNG). The latest numbers are also kept as plain data (`view` or
`curves`). Figures are drawn with matplotlib's object API, not pyplot, so the
widgets work under any backend and leave no open pyplot figures behind.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from .._validate import check_int
from ..decoding.record import record_generation
from .plots import (
    accept_reject_view,
    load_view,
    normalize_weights,
    plot_accept_reject,
    plot_load_view,
    plot_speedup_curves,
    speedup_curves,
)

_SLIDER_STYLE = {"description_width": "initial"}


def _slider_layout() -> widgets.Layout:
    # A fixed width keeps the track long enough to drag even with a long description.
    return widgets.Layout(width="560px")


def _image() -> widgets.Image:
    # flex-start stops the output box from stretching the PNG beyond its pixel size (blurry plots).
    return widgets.Image(format="png", layout=widgets.Layout(align_self="flex-start"))


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # Fixed margins (set by the caller) instead of bbox_inches="tight": one draw, not two.
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


def format_accept_reject(view: dict, labels: Sequence[str]) -> str:
    """The numbers of `accept_reject_view` as an HTML table (3 decimals); the verdict compares the rule's output with p."""
    beta = view["beta"]
    gap = float(np.abs(view["rule_output"] - view["p"]).max())
    rows = "".join(
        f"<tr><td>{html.escape(str(lab))}</td>"
        + "".join(f"<td>{view[key][i]:.3f}</td>" for key in ("p", "q", "accepted", "residual_mass", "output", "rule_output"))
        + "</tr>"
        for i, lab in enumerate(labels)
    )
    return (
        f"<p>acceptance probability <b>beta = {beta:.3f}</b>, rejection probability 1 - beta = {1 - beta:.3f}; "
        f"verify_chain emits p: <b>{'yes' if gap < 1e-12 else 'NO'}</b> (largest difference {gap:.1e})</p>"
        "<table><tr><th>token</th><th>p</th><th>q</th><th>accepted min(p,q)</th>"
        "<th>residual mass</th><th>accepted + residual</th><th>verify_chain emits (exact)</th></tr>"
        f"{rows}</table>"
    )


def format_speedup(curves: dict, k: int) -> str:
    """The chosen k's tokens per step and speedup, and the best k, as one line of HTML."""
    best, alpha, c = curves["optimal_k"], curves["alpha"], curves["c"]
    advice = "drafting does not pay here (k = 0)" if best == 0 else f"<b>best k = {best}</b>: speedup {curves['best_speedup']:.2f}x"
    return (
        f"<p>alpha = {alpha:.2f}, c = {c:.2f}. "
        f"<b>k = {k}</b>: E[tokens per step] = {curves['tokens_per_step'][k]:.2f}, "
        f"speedup = {curves['speedup'][k]:.2f}x. {advice}.</p>"
    )


class _Refreshing:
    """Redraw on every slider change, except inside `held()`, which redraws once at the end."""

    _held = False

    def _on_change(self, _change: dict) -> None:
        if not self._held:
            self.refresh()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Set several sliders at once: one redraw when the block ends, not one per slider."""
        self._held = True
        try:
            yield
        finally:
            self._held = False
            self.refresh()

    def refresh(self) -> None:  # pragma: no cover - each widget defines it
        raise NotImplementedError


class AcceptRejectWidget(_Refreshing, widgets.VBox):
    """Sliders for p and q over a few tokens; bars for the accepted mass, the residual mass and the output.

    Slider positions are weights, normalized to sum to 1. Attributes: `p_sliders`,
    `q_sliders` (lists of FloatSlider), `summary` (HTML), `figure` (Image),
    `view` (the latest `accept_reject_view`, None while a side has no weight).
    """

    def __init__(
        self,
        p: Sequence[float] = (0.6, 0.3, 0.1),
        q: Sequence[float] = (0.3, 0.6, 0.1),
        labels: Sequence[str] | None = None,
    ):
        p0, q0 = normalize_weights(p, "p"), normalize_weights(q, "q")
        if p0.shape != q0.shape:
            raise ValueError(f"p and q must cover the same tokens, got {len(p0)} and {len(q0)}")
        V = len(p0)
        if not 2 <= V <= 6:
            raise ValueError(f"p and q must have 2 to 6 tokens to fit on sliders, got {V}")
        self.labels = list(labels) if labels is not None else [chr(ord("a") + i) for i in range(V)]
        if len(self.labels) != V:
            raise ValueError(f"labels must name the {V} tokens, got {len(self.labels)}")

        def slider(side: str, i: int, value: float) -> widgets.FloatSlider:
            return widgets.FloatSlider(
                value=round(float(value), 2), min=0.0, max=1.0, step=0.01,
                description=f"{side}({self.labels[i]})", continuous_update=False,
                readout_format=".2f", style=_SLIDER_STYLE, layout=_slider_layout(),
            )

        self.p_sliders = [slider("p", i, v) for i, v in enumerate(p0)]
        self.q_sliders = [slider("q", i, v) for i, v in enumerate(q0)]
        self.summary = widgets.HTML()
        self.summary.add_class("specref-accept-reject-summary")
        self.figure = _image()
        self.figure.add_class("specref-accept-reject-plot")
        self.view: dict | None = None
        columns = widgets.HBox([
            widgets.VBox([widgets.HTML("<b>target p</b> (weights, normalized)"), *self.p_sliders]),
            widgets.VBox([widgets.HTML("<b>draft q</b> (weights, normalized)"), *self.q_sliders]),
        ])
        super().__init__([columns, self.summary, self.figure])
        for s in self.p_sliders + self.q_sliders:
            s.observe(self._on_change, names="value")
        self.refresh()

    @property
    def p(self) -> np.ndarray:  # [V] normalized slider weights
        return normalize_weights([s.value for s in self.p_sliders], "p")

    @property
    def q(self) -> np.ndarray:  # [V]
        return normalize_weights([s.value for s in self.q_sliders], "q")

    def refresh(self) -> None:
        """Recompute the view from the sliders and redraw the summary and the bars."""
        try:
            p, q = self.p, self.q
        except ValueError:
            self.view = None
            self.summary.value = "<p><b>Put some weight on at least one token for both p and q.</b></p>"
            return
        self.view = accept_reject_view(p, q)
        self.summary.value = format_accept_reject(self.view, self.labels)
        fig = Figure(figsize=(6.5, 3.4))
        fig.subplots_adjust(left=0.1, right=0.98, bottom=0.09, top=0.9)
        plot_accept_reject(self.view, self.labels, ax=fig.add_subplot())
        self.figure.value = _png(fig)


class SpeedupWidget(_Refreshing, widgets.VBox):
    """alpha, k and c sliders driving the tokens-per-step and speedup curves, with the best k marked.

    Attributes: `alpha_slider`, `k_slider`, `c_slider`, `summary` (HTML), `figure`
    (Image), `curves` (the latest `speedup_curves`), `k_max`.
    """

    def __init__(self, alpha: float = 0.8, k: int = 4, c: float = 0.05, k_max: int = 16):
        self.k_max = k_max
        speedup_curves(alpha, c, k_max)  # raises on bad alpha, c or k_max before any widget exists
        if not 0 <= k <= k_max:
            raise ValueError(f"k must be in 0..k_max = 0..{k_max}, got {k}")
        self.alpha_slider = widgets.FloatSlider(
            value=alpha, min=0.0, max=1.0, step=0.01, description="alpha (acceptance rate)",
            continuous_update=False, readout_format=".2f", style=_SLIDER_STYLE, layout=_slider_layout(),
        )
        self.k_slider = widgets.IntSlider(
            value=k, min=0, max=k_max, step=1, description="k (drafts per step)",
            continuous_update=False, style=_SLIDER_STYLE, layout=_slider_layout(),
        )
        self.c_slider = widgets.FloatSlider(
            value=c, min=0.0, max=0.5, step=0.01, description="c (draft step cost / target step cost)",
            continuous_update=False, readout_format=".2f", style=_SLIDER_STYLE, layout=_slider_layout(),
        )
        self.summary = widgets.HTML()
        self.summary.add_class("specref-speedup-summary")
        self.figure = _image()
        self.figure.add_class("specref-speedup-plot")
        self.curves: dict = {}
        super().__init__([self.alpha_slider, self.k_slider, self.c_slider, self.summary, self.figure])
        for s in (self.alpha_slider, self.k_slider, self.c_slider):
            s.observe(self._on_change, names="value")
        self.refresh()

    def refresh(self) -> None:
        """Recompute the curves from the sliders and redraw the summary and the plot."""
        k = self.k_slider.value
        self.curves = speedup_curves(self.alpha_slider.value, self.c_slider.value, self.k_max)
        self.summary.value = format_speedup(self.curves, k)
        fig = Figure(figsize=(10, 3.6))
        fig.subplots_adjust(left=0.06, right=0.99, bottom=0.14, top=0.92, wspace=0.2)
        plot_speedup_curves(self.curves, k=k, axes=fig.subplots(1, 2))
        self.figure.value = _png(fig)


def accept_reject_widget(
    p: Sequence[float] = (0.6, 0.3, 0.1),
    q: Sequence[float] = (0.3, 0.6, 0.1),
    labels: Sequence[str] | None = None,
) -> AcceptRejectWidget:
    """Notebook 02's widget: move p and q, watch accepted + residual mass always add up to p."""
    return AcceptRejectWidget(p, q, labels)


def speedup_widget(alpha: float = 0.8, k: int = 4, c: float = 0.05, k_max: int = 16) -> SpeedupWidget:
    """Notebook 03's widget: move alpha, k and c, watch tokens per step, speedup and the best k."""
    return SpeedupWidget(alpha, k, c, k_max)


# -- notebook 05: a generation, step by step -----------------------------------------------------

_STEP_STYLE = {
    "accepted": "background:#c8e6c9",  # green: a draft the target accepted
    "correction": "background:#ffcdd2",  # red: the target's token after a rejected draft
    "bonus": "background:#bbdefb",  # blue: the target's extra token after all k drafts were accepted
    "target": "background:#eeeeee",  # grey: k shrank to 0 at the end of the budget, the target's own token
}


def format_steps(steps: Sequence, token_str: Callable[[int], str], prompt: str = "") -> str:
    """A recorded generation (`specref.decoding.record.record_generation`) as HTML, one span per token.

    Accepted drafts, corrections and bonus tokens get their own colour (and class, `specref-<kind>`);
    a correction's tooltip names the draft it replaced. A thin bar separates steps.
    """
    parts = [f"<span style='color:#777'>{html.escape(prompt)}</span>"] if prompt else []
    for i, step in enumerate(steps):
        if len(step.emitted) != step.n_accepted + 1:
            raise ValueError(f"step {i} emitted {len(step.emitted)} tokens but accepted {step.n_accepted} drafts: "
                             "a step emits its accepted drafts and one token from the target")
        kinds = ["accepted"] * step.n_accepted + [step.kind]
        spans = []
        for tok, kind in zip(step.emitted, kinds):
            title = f"step {i + 1}: {kind}"
            if kind == "correction":
                title += f" (replaced draft {token_str(step.rejected)!r})"
            spans.append(f"<span class='specref-{kind}' style='{_STEP_STYLE[kind]}' title='{html.escape(title)}'>"
                         f"{html.escape(token_str(tok))}</span>")
        parts.append("".join(spans) + "<span style='border-left:1px solid #999'></span>")
    counts = {kind: 0 for kind in _STEP_STYLE}
    for step in steps:
        counts["accepted"] += step.n_accepted
        counts[step.kind] += 1
    emitted = sum(len(s.emitted) for s in steps)
    legend = " ".join(f"<span style='{_STEP_STYLE[kind]}'>{kind}</span> {counts[kind]}" for kind in _STEP_STYLE)
    return (f"<p>{len(steps)} steps, {emitted} tokens: {emitted / max(len(steps), 1):.2f} tokens per target pass. "
            f"{legend}</p><pre style='white-space:pre-wrap;line-height:1.5'>{''.join(parts)}</pre>")


class DraftStepsWidget(_Refreshing, widgets.VBox):
    """Pick a draft and k; see the generated text with each step's accepted drafts, corrections and bonus tokens.

    `drafts` maps a name to a ready draft for `target`. Attributes: `draft_dropdown`,
    `k_slider`, `view` (HTML), `steps` (the latest recorded steps), `output` (the
    latest generated ids).
    """

    def __init__(self, target, drafts: dict, prompt_ids, tokenizer, k: int = 4, max_new_tokens: int = 48,
                 temperature: float = 0.0, k_max: int = 8, seed: int = 0):
        if not drafts:
            raise ValueError("drafts must name at least one draft")
        if not 1 <= k <= k_max:
            raise ValueError(f"k must be in 1..k_max = 1..{k_max}, got {k}")
        self.target, self.drafts, self.tokenizer = target, dict(drafts), tokenizer
        self.prompt_ids, self.max_new_tokens, self.temperature, self.seed = prompt_ids, max_new_tokens, temperature, seed
        self.draft_dropdown = widgets.Dropdown(options=list(self.drafts), description="draft", style=_SLIDER_STYLE)
        self.k_slider = widgets.IntSlider(value=k, min=1, max=k_max, step=1, description="k (drafts per step)",
                                          continuous_update=False, style=_SLIDER_STYLE, layout=_slider_layout())
        self.view = widgets.HTML()
        self.view.add_class("specref-draft-steps")
        self.steps: list = []
        self.output = None
        self.k_max = k_max
        super().__init__([widgets.HBox([self.draft_dropdown, self.k_slider]), self.view])
        self._fit_k_slider()
        self.draft_dropdown.observe(self._on_draft, names="value")
        self.k_slider.observe(self._on_change, names="value")
        self.refresh()

    def _fit_k_slider(self) -> None:
        """The k slider ends at the chosen draft's `max_k` (Medusa: its heads, MTP: its modules), else at k_max."""
        limit = self.drafts[self.draft_dropdown.value].max_k
        top = self.k_max if limit is None else min(self.k_max, limit)
        self.k_slider.value = min(self.k_slider.value, top)  # before max: the slider would clamp silently
        self.k_slider.max = top

    def _on_draft(self, change: dict) -> None:
        with self.held():  # a lowered k and the new draft: one redraw
            self._fit_k_slider()

    def refresh(self) -> None:
        """Generate with the chosen draft and k (fixed seed) and redraw the highlighted text."""
        g = torch.Generator(device=self.target.device).manual_seed(self.seed)
        self.output, self.steps, _ = record_generation(
            self.target, self.drafts[self.draft_dropdown.value], self.prompt_ids, self.k_slider.value,
            self.max_new_tokens, self.temperature, g)
        prompt = self.tokenizer.decode(self.prompt_ids.reshape(-1).tolist())
        self.view.value = format_steps(self.steps, self.tokenizer.token_str, prompt)


def draft_steps_widget(target, drafts: dict, prompt_ids, tokenizer, k: int = 4, max_new_tokens: int = 48,
                       temperature: float = 0.0) -> DraftStepsWidget:
    """Notebook 05's widget: pick a draft and k, watch which drafts the target accepts, step by step."""
    return DraftStepsWidget(target, drafts, prompt_ids, tokenizer, k, max_new_tokens, temperature)


# -- notebook 07: batch, k and alpha over the predicted throughput ----------------------------------

def format_load(view: dict, B: int, policy_k: int) -> str:
    """The predicted speedup at one batch size and the k the policy picks there, as HTML."""
    i = int(np.flatnonzero(view["batch_sizes"] == B)[0])
    s = view["speedup"][i]
    verdict = "pays" if s > 1 else "loses"
    return (f"<p>B = {B}, k = {view['k']}, alpha = {view['alpha']:.2f}: predicted speedup <b>{s:.2f}x</b> "
            f"(speculation {verdict}); choose_k picks <b>k = {policy_k}</b> here.</p>")


class LoadWidget(_Refreshing, widgets.VBox):
    """Sliders for B, k and alpha over a `CostModel`'s predicted throughput, with measured points drawn on it.

    Attributes: `batch_slider` (a SelectionSlider over the measured batch sizes),
    `k_slider`, `alpha_slider`, `summary` (HTML), `figure` (Image), `view` (the latest
    `load_view`), `policy_k` (choose_k at the slider's B and alpha).
    """

    def __init__(self, view: dict, B: int = 8, k: int = 4, alpha: float | None = None, margin: float | None = None):
        self.base = view
        self.margin = view["margin"] if margin is None else margin
        Bs = [int(b) for b in view["batch_sizes"]]
        if B not in Bs:
            raise ValueError(f"B must be one of the measured batch sizes {Bs}, got {B}")
        check_int("k", k, 1, "draft tokens per step, 1..8 on the k slider", wrong_type=ValueError)
        if k > 8:
            raise ValueError(f"k must be an integer in 1..8 (the k slider's range), got {k!r}")
        if alpha is not None and not (isinstance(alpha, (int, float)) and 0.3 <= alpha <= 0.95):
            raise ValueError(f"alpha must be a number in 0.3..0.95 (the alpha slider's range) or None, got {alpha!r}")
        self.batch_slider = widgets.SelectionSlider(options=Bs, value=B, description="B (batch size)",
                                                    continuous_update=False, style=_SLIDER_STYLE,
                                                    layout=_slider_layout())
        self.k_slider = widgets.IntSlider(value=k, min=1, max=8, description="k (drafts per step)",
                                          continuous_update=False, style=_SLIDER_STYLE, layout=_slider_layout())
        self.alpha_slider = widgets.FloatSlider(value=view["alpha"] if alpha is None else alpha, min=0.3, max=0.95,
                                                step=0.01, description="alpha", readout_format=".2f",
                                                continuous_update=False, style=_SLIDER_STYLE, layout=_slider_layout())
        self.summary, self.figure = widgets.HTML(), _image()
        self.view: dict = {}
        super().__init__([self.batch_slider, self.k_slider, self.alpha_slider, self.summary, self.figure])
        for s in (self.batch_slider, self.k_slider, self.alpha_slider):
            s.observe(self._on_change, names="value")
        self.refresh()

    def refresh(self) -> None:
        from ..perf.costmodel import choose_k

        b, k, alpha = self.base, self.k_slider.value, self.alpha_slider.value
        self.view = load_view(b["model"], alpha, k, b["batch_sizes"], b["new_tokens"])
        B = self.batch_slider.value
        self.policy_k = choose_k(alpha, B, b["model"], k_max=8, margin=self.margin, new_tokens=b["new_tokens"])
        self.summary.value = format_load(self.view, B, self.policy_k)
        measured = {"plain": dict(zip(b["batch_sizes"].tolist(), b["plain_tokens_per_s"].tolist()))}
        if k in b["ks"].tolist():
            j = b["ks"].tolist().index(k)
            measured["speculative"] = dict(zip(b["batch_sizes"].tolist(), b["tokens_per_s"][:, j].tolist()))
        fig = Figure(figsize=(6.5, 3.6))
        fig.subplots_adjust(left=0.12, right=0.98, bottom=0.14, top=0.9)
        ax = fig.add_subplot()
        plot_load_view(self.view, measured, ax=ax)
        ax.axvline(B, color="C3", lw=1, ls=":")
        self.figure.value = _png(fig)


def load_widget(view: dict, B: int = 8, k: int = 4, alpha: float | None = None) -> LoadWidget:
    """Notebook 07's widget: move B, k and alpha over a batch benchmark's model (`batch_view`)."""
    return LoadWidget(view, B, k, alpha)
