"""Open the Snakemake HTML report in headless Chromium and check that every section renders its figures.

The report (``snakemake --report results/report.html``) is one self-contained HTML file: a small React app with
every result embedded as a data URI. This drives it as a reader would, through the app it ships: each section
(category) is opened in the navigation bar, every result of it must be listed there, and every image of it is
shown in the content pane, where the browser must decode it (``naturalWidth`` > 0, the PNG's own size). Errors the
page logs to the browser console fail the check too, and so does inline data that is not escaped (a report from a
bare ``snakemake --report``, not ``retinabench report``: retinabench.report_build).

    python -m retinabench.report_check results/report.html [--screenshots DIR]

Needs Chromium and its WebDriver (Debian: ``chromium``, ``chromium-driver``) and the ``selenium`` package.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from retinabench.report_build import ReportBuildError, unescaped_inline_data

# Flags for a headless, offline, single-use browser (no sandbox as root in CI, no GPU, no network side traffic).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1600,1000")
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


class BrowserMissing(RuntimeError):
    """Chromium or chromedriver is not installed."""


@dataclass
class ReportCheck:
    sections: dict[str, list[dict]] = field(default_factory=dict)   # section -> [{path, mime, listed, width,...}]
    console_errors: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        lines = []
        for section, items in self.sections.items():
            images = [i for i in items if i["mime"].startswith("image/")]
            shown = [i for i in images if i.get("width")]
            lines.append(f"{section}: {len(items)} results, {len(shown)}/{len(images)} images rendered")
        lines += [f"PROBLEM: {p}" for p in self.problems]
        return "\n".join(lines)


def find_browser() -> tuple[str, str]:
    """(browser binary, chromedriver) paths, or BrowserMissing naming the Debian packages."""
    binary = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        raise BrowserMissing("headless Chromium and chromedriver are needed (Debian: apt-get install chromium "
                             f"chromium-driver); found browser={binary}, chromedriver={driver}")
    return binary, driver


# ready: the app and its data are defined (a data script that failed leaves `results` as the element of that id)
_READY = ("return typeof app !== 'undefined' && typeof categories !== 'undefined' && typeof results === 'object' "
          "&& !(results instanceof Element)")
_RESULTS = ("return Object.fromEntries(Object.entries(results).map(([k, v]) => "
            "[k, {name: v.name, mime: v.mime_type, labels: v.labels}]))")
_SHOW = "app.setView({content: 'img', contentPath: results[arguments[0]].data_uri, resultPath: arguments[0]});"
_IMAGE = ("const img = Array.from(document.images).find(i => i.getAttribute('src') === "
          "results[arguments[0]].data_uri);"
          "if (!img || !img.complete) return null;"
          "return [img.naturalWidth, img.naturalHeight, true];")


def _listed_as(result: dict) -> list[str]:
    """Texts the navigation shows for a result: the values of its report labels, or its file name."""
    import ast
    labels = result.get("labels")
    if isinstance(labels, str) and labels.strip():
        try:
            labels = ast.literal_eval(labels)
        except (ValueError, SyntaxError):
            labels = None
    if isinstance(labels, dict) and labels:
        return [str(v) for v in labels.values()]
    return [result["name"]]


def _all_listed(text: str, items: list[dict]) -> bool:
    return all(all(token in text for token in r["shown_as"]) for r in items)


def _navigation_lists(items: list[dict]) -> Callable[[Any], bool]:
    """A WebDriverWait condition: the report's navigation lists every item."""
    return lambda driver: _all_listed(driver.find_element("id", "app").text, items)


def _script_result(script: str, *args: Any) -> Callable[[Any], Any]:
    """A WebDriverWait condition: what ``script`` returns (falsy: not yet)."""
    return lambda driver: driver.execute_script(script, *args)


@contextmanager
def open_report(html: str | Path, *, timeout: float = 60.0):
    """Headless Chromium with a new, empty profile, ``html`` loaded in it (not yet waited for); yields the WebDriver,
    closed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    binary, driver_path = find_browser()
    with tempfile.TemporaryDirectory(prefix="retinabench-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            driver.set_page_load_timeout(timeout)
            driver.get(Path(html).resolve().as_uri())
            yield driver
        finally:
            driver.quit()


def _check_sections(driver, out: ReportCheck, shots: Path | None, timeout: float) -> None:
    """Open every section and subsection in the navigation as a reader clicks; show and measure every image."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait
    categories = driver.execute_script("return categories")
    results = driver.execute_script(_RESULTS)
    for r in results.values():  # how the navigation lists a result: its label values, else its name
        r["shown_as"] = _listed_as(r)
    if not categories:
        out.problems.append("the report has no sections (no result marked for the report?)")
    for n_section, (section, subcategories) in enumerate(categories.items()):
        items = out.sections.setdefault(section, [])
        for sub, paths in subcategories.items():
            # back to the section menu first, as a reader clicks (the list view keeps its first state)
            driver.execute_script("app.setView({navbarMode: 'menu'});")
            driver.execute_script("app.setView({navbarMode: 'subcategory', category: arguments[0], "
                                  "subcategory: arguments[1]});", section, sub)
            try:
                WebDriverWait(driver, min(timeout, 15.0)).until(_navigation_lists([results[p] for p in paths]))
            except TimeoutException:
                text = driver.find_element("id", "app").text
                missing = [p for p in paths if not _all_listed(text, [results[p]])]
                out.problems.append(f"{section} / {sub}: not listed in the navigation: {missing}")
            for path in paths:
                item = {"path": path, "mime": results[path]["mime"] or "", "subcategory": sub}
                items.append(item)
                if not item["mime"].startswith("image/"):
                    continue
                driver.execute_script(_SHOW, path)
                try:
                    shown = WebDriverWait(driver, timeout).until(_script_result(_IMAGE, path))
                except TimeoutException:
                    shown = None
                if not shown or not shown[2] or shown[0] <= 0:
                    out.problems.append(f"{section} / {sub}: {path} did not render ({shown})")
                    continue
                item["width"], item["height"] = int(shown[0]), int(shown[1])
                if shots:
                    driver.save_screenshot(str(shots / f"{n_section:02d}_{Path(path).parent.name}_"
                                                     f"{Path(path).stem}.png"))


def check_report(html: str | Path, *, screenshots: str | Path | None = None, timeout: float = 60.0) -> ReportCheck:
    """Open ``html`` in headless Chromium and check every section (see the module docstring)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait
    html = Path(html).resolve()
    if not html.is_file():
        raise FileNotFoundError(f"report {html} not found (retinabench report {html.name} writes it)")
    out = ReportCheck()
    try:
        unescaped = unescaped_inline_data(html.read_text())
    except ReportBuildError as err:
        unescaped, out.problems = [], [str(err)]
    if unescaped:
        out.problems.append(f"inline data not escaped (any string in it could end its <script>): {unescaped}; "
                            "build the report with `retinabench report`")
    shots = Path(screenshots) if screenshots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    with open_report(html, timeout=timeout) as driver:
        try:
            WebDriverWait(driver, timeout).until(lambda d: d.execute_script(_READY))
        except TimeoutException:
            out.problems.append(f"the report's app and data did not load within {timeout:.0f} s")
        else:
            _check_sections(driver, out, shots, timeout)
        for entry in driver.get_log("browser"):
            if entry.get("level") == "SEVERE":
                out.console_errors.append(entry.get("message", ""))
    out.problems += [f"browser console: {m}" for m in out.console_errors]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="the HTML report (retinabench report FILE)")
    ap.add_argument("--screenshots", help="folder for a screenshot of every figure as the browser shows it")
    args = ap.parse_args(argv)
    result = check_report(args.report, screenshots=args.screenshots)
    print(result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
