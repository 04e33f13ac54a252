"""The live-charts component's files: the page loads the plotly.js that the dashboard serves,
preloads every module of ours, and every module imported is there."""

import re

from dashboard.live_charts import PLOTLY, PLOTLY_JS, WEB


def test_the_page_loads_the_installed_plotly_js() -> None:
    html = (WEB / "index.html").read_text()
    (src,) = re.findall(r'src="\.\./([^"]+)/plotly\.min\.js"', html)
    assert src == PLOTLY_JS
    assert (PLOTLY / "plotly.min.js").is_file()


def test_the_page_preloads_every_module() -> None:
    html = (WEB / "index.html").read_text()
    preloaded = re.findall(r'<link rel="modulepreload" href="([a-z_]+\.js)"', html)
    assert sorted(preloaded) == sorted(p.name for p in WEB.glob("*.js"))


def test_every_imported_module_is_a_file_of_ours() -> None:
    imported = {
        name
        for js in WEB.glob("*.js")
        for name in re.findall(r'from "\./([a-z_]+\.js)"', js.read_text())
    }
    assert imported and imported <= {p.name for p in WEB.glob("*.js")}
