"""What a learner meets in JupyterLab: widget notebooks run, render and respond.

Each notebook in notebooks/ that uses widgets is opened in a real JupyterLab in headless
Chromium, run with Run All, and checked the way a learner would notice trouble: no cell
errors, every widget renders, plots are not blown up past their pixels, every slider has
a track long enough to drag, and moving each slider (by keyboard) changes the plot or
text it drives. A control notebook that has each of those faults proves the harness
flags them. One screenshot per widget cell goes to build/screenshots/.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_SOURCE = re.compile(
    r"\bipywidgets\b|\bspecref\.widgets\b|from\s+specref\s+import\s+[^\n]*\bwidgets\b"
)
OPEN_TIMEOUT_MS = 60_000
RUN_ALL_TIMEOUT_MS = 90_000
RENDER_TIMEOUT_MS = 30_000
SLIDER_MOVE_TIMEOUT_MS = 3_000
OUTPUT_CHANGE_TIMEOUT_MS = 8_000
SETTLE_TIMEOUT_S = 15
# A long description with description_width='initial' can squeeze a track to nothing.
MIN_TRACK_PX = 100


def uses_widgets(path: Path) -> bool:
    """A notebook uses widgets if a code cell imports them or a saved output shows one."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if WIDGET_SOURCE.search(cell.source):
            return True
        if any(WIDGET_MIME in out.get("data", {}) for out in cell.get("outputs", [])):
            return True
    return False


WIDGET_NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb") if uses_widgets(p))


# --- the driver: JavaScript run in the page ----------------------------------------------

# Ready: our notebook is the current tab and its kernel is idle. Its DOM node is then
# tagged, so every query below reads this notebook and no other tab.
_NOTEBOOK_READY = """(path) => {
  const app = window.jupyterapp;
  const w = app && app.shell.currentWidget;
  const kernel = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  const ready = !!(kernel && kernel.status === 'idle' && w.context.path === path && w.content.widgets.length);
  if (ready) w.content.node.setAttribute('data-under-test', '');
  return ready;
}"""

# Run All, without awaiting it here: evaluate() has no timeout, wait_for_function has.
_RUN_ALL = """() => {
  const app = window.jupyterapp;
  app.shell.collapseLeft();  // the file browser only takes room from the screenshots
  window.specrefRunAll = null;
  app.commands.execute('notebook:run-all-cells').then(
    () => { window.specrefRunAll = 'done'; }, e => { window.specrefRunAll = `failed: ${e}`; });
}"""

# Cells from the notebook model: what ran, what failed, which outputs are widgets.
_CELLS = """([mime]) => {
  const w = window.jupyterapp.shell.currentWidget;
  return w.content.widgets.map((cell, index) => {
    const model = cell.model;
    const outputs = model.type === 'code' ? model.outputs.toJSON() : [];
    return {
      index,
      type: model.type,
      execution_count: model.type === 'code' ? model.executionCount : null,
      errors: outputs.filter(o => o.output_type === 'error').map(o => `${o.ename}: ${o.evalue}`),
      widget_outputs: outputs.filter(o => o.data && o.data[mime]).length,
    };
  });
}"""

# Per cell, what the page shows: widget views, placeholders, rendered tracebacks.
_RENDERED = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  return w.content.widgets.map(cell => {
    const area = cell.node.querySelector('.jp-Cell-outputArea');
    if (!area) return {stretched: [], views: 0, loading: false, broken: [], tracebacks: []};
    const text = area.textContent;
    const stderr = Array.from(area.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'));
    return {
      // A plot drawn wider than its pixels is blurry and pushes the sliders off screen.
      stretched: Array.from(area.querySelectorAll('img')).filter(
        img => img.naturalWidth && img.getBoundingClientRect().width > 1.1 * img.naturalWidth
      ).map(img => `${img.naturalWidth}px image drawn ${Math.round(img.getBoundingClientRect().width)}px wide`),
      views: area.querySelectorAll('.jupyter-widgets').length,
      loading: text.includes('Loading widget...'),
      broken: (text.match(/Error displaying widget[^\\n]*/g) || []),
      tracebacks: stderr.map(e => e.textContent).filter(t => /Traceback|\\w+(Error|Exception)\\b/.test(t))
                        .map(t => t.slice(0, 400)),
    };
  });
}"""

# Everything the outputs show except the sliders themselves: the images, the text.
_FINGERPRINT = """() => {
  const parts = [];
  for (const area of document.querySelectorAll('.jp-Notebook[data-under-test] .jp-Cell-outputArea')) {
    const clone = area.cloneNode(true);
    clone.querySelectorAll('.widget-slider, .widget-readout').forEach(e => e.remove());
    parts.push(clone.textContent);
    area.querySelectorAll('img').forEach(img => parts.push(img.getAttribute('src') || ''));
    area.querySelectorAll('svg').forEach(svg => parts.push(svg.outerHTML));
  }
  return parts.join('\\u0000');
}"""

_KERNEL_IDLE = """() => {
  const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  return k.status === 'idle';
}"""

_SLIDERS = """() => Array.from(document.querySelectorAll('.jp-Notebook[data-under-test] .widget-slider')).map(s => {
  const cell = s.closest('.jp-Cell');
  const cells = Array.from(document.querySelectorAll('.jp-Notebook[data-under-test] .jp-Cell'));
  const label = s.querySelector('.widget-label');
  const track = s.querySelector('.noUi-target');
  return {cell: cells.indexOf(cell), label: label ? label.textContent.trim() : '',
          track: track ? Math.round(track.getBoundingClientRect().width) : 0};
})"""


@dataclass
class SliderCheck:
    cell: int
    label: str
    moved: bool  # the slider's own value changed under the keyboard
    drives_output: bool  # some image or text in the outputs changed with it
    track_px: int  # how wide the track is that a mouse can drag along


@dataclass
class LabReport:
    name: str
    unexecuted: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    widget_cells: list[int] = field(default_factory=list)
    unrendered: list[str] = field(default_factory=list)
    stretched: list[str] = field(default_factory=list)
    sliders: list[SliderCheck] = field(default_factory=list)
    widget_console_errors: list[str] = field(default_factory=list)
    screenshots: list[Path] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each phase


def _settle(page) -> None:  # noqa: ANN001
    """Wait until the kernel is idle and the outputs stop changing (redraws come in steps)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    before = page.evaluate(_FINGERPRINT)
    while time.monotonic() < deadline:
        page.wait_for_timeout(300)
        after = page.evaluate(_FINGERPRINT)
        if after == before and page.evaluate(_KERNEL_IDLE):
            return
        before = after


def _move_slider(page, index: int) -> bool:  # noqa: ANN001
    """Press arrow keys on the slider's handle; return whether its value changed."""
    slider = page.locator(".jp-Notebook[data-under-test] .widget-slider").nth(index)
    handle = slider.locator(".noUi-handle").first
    # The readout is what the learner sees; aria-valuenow alone is rounded to one decimal.
    value = "(s) => (s.querySelector('.widget-readout') || {}).textContent + '|' +" \
            " s.querySelector('.noUi-handle').getAttribute('aria-valuenow')"
    start = slider.evaluate(value)
    handle.scroll_into_view_if_needed(timeout=SLIDER_MOVE_TIMEOUT_MS)
    for key in ("ArrowRight", "ArrowLeft"):  # a slider at its maximum can only go left
        handle.focus()
        for _ in range(2):
            page.keyboard.press(key)
        try:
            page.wait_for_function(
                f"([s, v]) => ({value})(s) !== v",
                arg=[slider.element_handle(), start],
                timeout=SLIDER_MOVE_TIMEOUT_MS,
            )
            return True
        except Exception:  # noqa: BLE001 - Playwright's TimeoutError: try the other way
            continue
    return False


def _screenshot(page, cell: int, path: Path) -> Path:  # noqa: ANN001
    """The whole widget cell, code and output, however tall it is."""
    cells = page.locator(".jp-Notebook[data-under-test] .jp-Cell")
    cells.nth(cell).screenshot(path=str(path), timeout=RENDER_TIMEOUT_MS)
    return path


def run_in_lab(browser, lab, name: str, screenshots: Path) -> LabReport:  # noqa: ANN001
    """Open `name` in JupyterLab, Run All, then move every slider and watch the outputs."""
    report = LabReport(name=name)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(OPEN_TIMEOUT_MS)
    page.on(
        "console",
        lambda m: report.widget_console_errors.append(m.text[:300])
        if m.type == "error" and "widget" in m.text.lower()
        else None,
    )
    clock = time.monotonic()

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.monotonic()
        report.seconds[phase] = round(now - clock, 1)
        clock = now

    try:
        page.goto(lab.notebook_url(name), timeout=OPEN_TIMEOUT_MS)
        page.wait_for_function(_NOTEBOOK_READY, arg=name, timeout=OPEN_TIMEOUT_MS, polling=250)
        lap("open")
        page.set_default_timeout(RUN_ALL_TIMEOUT_MS)
        page.evaluate(_RUN_ALL)
        page.wait_for_function("() => window.specrefRunAll", timeout=RUN_ALL_TIMEOUT_MS, polling=250)
        page.wait_for_function(_KERNEL_IDLE, timeout=RUN_ALL_TIMEOUT_MS, polling=250)
        lap("run all")

        cells = page.evaluate(_CELLS, [WIDGET_MIME])
        report.unexecuted = [c["index"] for c in cells if c["type"] == "code" and c["execution_count"] is None]
        report.errors = [f"cell {c['index']}: {e}" for c in cells for e in c["errors"]]
        report.widget_cells = [c["index"] for c in cells if c["widget_outputs"]]

        # Widget views render after the kernel goes idle; give them time to leave "Loading".
        page.wait_for_function(
            "(ids) => { const w = window.jupyterapp.shell.currentWidget;"
            " return ids.every(i => { const a = w.content.widgets[i].node.querySelector('.jp-Cell-outputArea');"
            " return a && !a.textContent.includes('Loading widget...') &&"
            " (a.querySelector('.jupyter-widgets') || a.textContent.includes('Error displaying widget')); }); }",
            arg=report.widget_cells,
            timeout=RENDER_TIMEOUT_MS,
            polling=250,
        )
        _settle(page)
        lap("render")

        for index, slider in enumerate(page.evaluate(_SLIDERS)):
            before = page.evaluate(_FINGERPRINT)
            moved = _move_slider(page, index)
            try:
                page.wait_for_function(
                    f"(before) => ({_FINGERPRINT})() !== before",
                    arg=before,
                    timeout=OUTPUT_CHANGE_TIMEOUT_MS,
                    polling=200,
                )
                changed = True
            except Exception:  # noqa: BLE001 - Playwright's TimeoutError: nothing changed
                changed = False
            _settle(page)
            report.sliders.append(SliderCheck(slider["cell"], slider["label"], moved, changed, slider["track"]))
        lap("sliders")

        # Checked after the sliders moved: a callback that raises shows its traceback only now.
        rendered = page.evaluate(_RENDERED)
        for i in report.widget_cells:
            r = rendered[i]
            if r["loading"] or not r["views"]:
                report.unrendered.append(f"cell {i}: no widget view rendered")
            report.unrendered += [f"cell {i}: {b}" for b in r["broken"]]
        report.stretched = [f"cell {i}: {x}" for i, r in enumerate(rendered) for x in r["stretched"]]
        report.errors += [
            f"cell {i}: {t}" for i, r in enumerate(rendered) for t in r["tracebacks"]
            if not any(e.startswith(f"cell {i}:") for e in report.errors)
        ]

        stem = Path(name).stem
        report.screenshots = [
            _screenshot(page, i, screenshots / f"{stem}-cell{i:02d}.png") for i in report.widget_cells
        ]
        lap("screenshots")
        page.evaluate(  # frees the kernel's memory for the next notebook; bounded, unlike shutdown()
            "() => Promise.race([window.jupyterapp.shell.currentWidget.sessionContext.shutdown(),"
            " new Promise(resolve => setTimeout(resolve, 10000))])"
        )
    finally:
        context.close()
    return report


def _describe(report: LabReport) -> str:
    return json.dumps(
        {k: [str(x) for x in v] if isinstance(v, list) else v for k, v in report.__dict__.items()},
        indent=1,
    )


# --- the tests ---------------------------------------------------------------------------

def test_course_has_widget_notebooks() -> None:
    assert WIDGET_NOTEBOOKS, "no notebook in notebooks/ uses widgets; the browser test would check nothing"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", WIDGET_NOTEBOOKS)
def test_widget_notebook_runs_renders_and_responds_in_lab(browser, lab, screenshots, name) -> None:  # noqa: ANN001
    report = run_in_lab(browser, lab, name, screenshots)
    print(f"{name}: seconds {report.seconds}; screenshots in {screenshots}")
    problems = {
        "cells not run by Run All": report.unexecuted,
        "cells that raised": report.errors,
        "no cell displayed a widget": [] if report.widget_cells else [name],
        "widgets that did not render": report.unrendered,
        "plots drawn wider than their pixels (blurry)": report.stretched,
        "widget errors in the browser console": report.widget_console_errors,
        "no slider to move": [] if report.sliders else [name],
        "sliders that ignored the keyboard": [s.label for s in report.sliders if not s.moved],
        f"slider tracks shorter than {MIN_TRACK_PX} px (hard to drag)": [
            f"{s.label}: {s.track_px} px" for s in report.sliders if s.track_px < MIN_TRACK_PX
        ],
        "sliders that change nothing on screen": [s.label for s in report.sliders if not s.drives_output],
    }
    problems = {what: found for what, found in problems.items() if found}
    assert not problems, json.dumps(problems, indent=1) + "\n" + _describe(report)


def _control_notebook() -> nbformat.NotebookNode:
    """A live slider, a short dead slider beside a stretched image, a slider whose callback raises,
    a widget that cannot render and a cell that raises."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Harness control"),
        nbformat.v4.new_code_cell(
            "import ipywidgets as widgets\nimport matplotlib.pyplot as plt\nfrom IPython.display import display"
        ),
        nbformat.v4.new_code_cell(
            "n = widgets.IntSlider(value=3, min=1, max=10, description='live')\n"
            "label = widgets.HTML()\n"
            "def draw(n):\n"
            "    label.value = f'<b>n squared = {n * n}</b>'\n"
            "    fig, ax = plt.subplots(figsize=(4, 3))\n"
            "    ax.bar(range(n), [i * i for i in range(n)])\n"
            "    plt.show()\n"
            "display(widgets.VBox([n, label, widgets.interactive_output(draw, {'n': n})]))"
        ),
        nbformat.v4.new_code_cell(
            "import io\nfrom matplotlib.figure import Figure\n"
            "png = io.BytesIO()\nFigure(figsize=(1, 1), dpi=50).savefig(png, format='png')\n"
            "short = widgets.Layout(width='150px')\n"
            "display(widgets.IntSlider(value=5, min=0, max=10, description='dead', layout=short),\n"
            "        widgets.Image(value=png.getvalue(), layout=widgets.Layout(width='400px')))"
        ),
        nbformat.v4.new_code_cell(
            "def fail(n):\n"
            "    if n != 5:\n"
            "        raise RuntimeError('callback broke')\n"
            "    print('n is', n)\n"
            "s = widgets.IntSlider(value=5, min=0, max=10, description='raising')\n"
            "display(widgets.VBox([s, widgets.interactive_output(fail, {'n': s})]))"
        ),
        nbformat.v4.new_code_cell(
            "display({'application/vnd.jupyter.widget-view+json':"
            " {'model_id': 'no-such-model', 'version_major': 2, 'version_minor': 0}}, raw=True)"
        ),
        nbformat.v4.new_code_cell("raise ValueError('deliberate')"),
    ]
    return nb


@pytest.mark.timeout(90)
def test_harness_flags_errors_dead_or_short_sliders_stretched_plots_and_unrendered_widgets(
    browser, lab, screenshots  # noqa: ANN001
) -> None:
    nbformat.write(_control_notebook(), lab.root / "_harness_control.ipynb")
    report = run_in_lab(browser, lab, "_harness_control.ipynb", screenshots)
    detail = _describe(report)
    assert report.widget_cells == [2, 3, 4, 5], detail
    assert [s.track_px >= MIN_TRACK_PX for s in report.sliders] == [True, False, True], detail
    assert [(s.label, s.moved, s.drives_output) for s in report.sliders] == [
        ("live", True, True),
        ("dead", True, False),
        ("raising", True, True),  # the traceback replaces the text: a change, caught as an error
    ], detail
    assert report.stretched == ["cell 3: 50px image drawn 400px wide"], detail
    assert len(report.unrendered) == 1 and report.unrendered[0].startswith("cell 5:"), detail
    assert len(report.errors) == 2, detail
    assert report.errors[0].startswith("cell 6: ValueError: deliberate"), detail
    assert report.errors[1].startswith("cell 4:") and "RuntimeError" in report.errors[1], detail
