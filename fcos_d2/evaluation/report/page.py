"""``report.html``: one evaluation on one page (metrics, precision-recall curves, AP per
class, the worst images), with pictures from its ``report/`` folder, relative links only,
so that the folder can be copied or served as it is.

A script in the page marks an image that does not load, visibly (and in
``<body data-broken-images>``, with ``data-images`` the count of images).
"""
import html
import os
from typing import Dict, List, Mapping, Sequence, Tuple

__all__ = ["add_page_note", "write_report_page"]

_STYLE = """body{font-family:sans-serif;margin:1.5em;color:#222}
h2{margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse}td,th{padding:2px 8px;text-align:right;border:1px solid #ddd}
.plots img{margin:4px;border:1px solid #eee}
.worst figure{display:inline-block;margin:6px;vertical-align:top}
figcaption{font-size:0.85em}.broken{outline:3px solid red}
.key span{padding:0 6px;color:#fff}"""

# Marks images that failed to load: after the load event every image has either loaded or
# failed, so naturalWidth tells them apart.
_CHECK_IMAGES = """<script>
window.addEventListener("load", function () {
  var images = document.images, broken = [];
  for (var i = 0; i < images.length; i++) {
    if (!images[i].complete || images[i].naturalWidth === 0) {
      images[i].classList.add("broken"); broken.push(images[i].getAttribute("src"));
    }
  }
  document.body.dataset.images = images.length;
  document.body.dataset.brokenImages = broken.length;
  if (broken.length) {
    var note = document.createElement("p");
    note.className = "broken"; note.textContent = "Images that did not load: " + broken.join(", ");
    document.body.insertBefore(note, document.body.firstChild);
  }
});
</script>"""


def _metrics_table(results: Mapping[str, Mapping[str, float]]) -> str:
    rows = []
    for task, metrics in results.items():
        names = [n for n in metrics if not n.startswith("AP-")]
        rows.append("<tr><th>" + html.escape(task) + "</th>" + "".join(
            f"<td>{html.escape(n)} {metrics[n]:.2f}</td>" for n in names) + "</tr>")
    return "<table>" + "".join(rows) + "</table>"


def _images(paths: Sequence[str], folder: str) -> str:
    return "".join(f'<img src="{html.escape(os.path.relpath(p, folder))}" alt="'
                   f'{html.escape(os.path.basename(p))}">' for p in paths)


def write_report_page(path: str, *, title: str, results: Mapping[str, Mapping[str, float]],
                      plots: Dict[str, List[str]], worst: Sequence[Tuple[str, str]],
                      notes: Sequence[str] = ()) -> str:
    """Writes the page.

    Args:
        path: the page, e.g. ``.../inference/<dataset>/report.html``.
        title: its heading (dataset, iterations, time).
        results: COCOEvaluator's results, task -> metric -> value (percent).
        plots: task -> PNGs to show in its section (curves, then AP bars).
        worst: (picture, caption) of the worst images, worst first.
        notes: lines shown under the title (what was left out, and why).
    """
    folder = os.path.dirname(os.path.abspath(path))
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             *[f"<p>{html.escape(n)}</p>" for n in notes], _metrics_table(results)]
    for task, pictures in plots.items():
        parts.append(f"<h2>{html.escape(task)}: precision-recall and AP per class</h2>"
                     f"<div class='plots'>{_images(pictures, folder)}</div>")
    parts.append("<h2>Worst images</h2><p class='key'>left: ground truth (<span style="
                 "'background:#28aa3c'>found</span> <span style='background:#ff9600'>missed"
                 "</span>); right: detections (<span style='background:#28aa3c'>correct</span>"
                 " <span style='background:#dc2828'>false</span>)</p><div class='worst'>")
    parts += [f"<figure>{_images([p], folder)}<figcaption>{html.escape(c)}</figcaption></figure>"
              for p, c in worst] or ["<p>No image with errors at this score threshold.</p>"]
    parts.append("</div>" + _CHECK_IMAGES + "</body></html>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return path


def add_page_note(path: str, note: str) -> None:
    """Adds ``note`` as a paragraph under the heading of the page at ``path`` (written by
    ``write_report_page``), e.g. which evaluation is the best so far."""
    with open(path, encoding="utf-8") as f:
        page = f.read()
    page = page.replace("</h1>", f"</h1>\n<p class='note'>{html.escape(note)}</p>", 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
