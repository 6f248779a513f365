"""The spawn form template: what it shows for a given summary (pure rendering)."""

from gpuspawner.allocator import ModelSummary
from gpuspawner.spawner import _templates

GTX = ModelSummary("NVIDIA GeForce GTX 1070", 8192, total=4, free=0, largest_block=0, unavailable=0)
A100 = ModelSummary("NVIDIA A100 80GB PCIe", 81920, total=8, free=3, largest_block=2, unavailable=2)


def render(paths=(), **kw):
    ctx = dict(models=[A100, GTX], max_count=2, limit=2, held=0, hosts=[], selected_free=None, error="")
    ctx.update(kw)
    return _templates(tuple(paths)).get_template("options_form.html").render(**ctx)


def test_models_with_counts_and_full_ones_disabled():
    html = render()
    assert "NVIDIA A100 80GB PCIe" in html and "80.0 GiB" in html
    assert "3 of 8 free now, up to 2 on one host (2 on hosts that are down, drained or paused)" in html
    assert "0 of 4 free now" in html
    gtx_input = html[html.index('value="NVIDIA GeForce GTX 1070"') - 200 : html.index('value="NVIDIA GeForce GTX 1070"') + 200]
    assert "disabled" in gtx_input
    assert 'id="gpu-model-none"' in html and "No GPU (CPU only)" in html
    assert '<option value="2">' in html and '<option value="3">' not in html
    assert 'name="gpu_host"' not in html  # host choice is off


def test_labels_are_tied_to_inputs():
    html = render()
    for i in (1, 2):
        assert f'id="gpu-model-{i}"' in html and f'for="gpu-model-{i}"' in html
    assert 'for="gpu-count"' in html and 'id="gpu-count"' in html


def test_host_choice_and_error_are_shown_escaped():
    html = render(hosts=["gpu-a"], error="<b>cluster</b> unreachable")
    assert '<option value="gpu-a">gpu-a</option>' in html
    assert "&lt;b&gt;cluster&lt;/b&gt; unreachable" in html


def test_admin_template_folder_overrides_the_form(tmp_path):
    (tmp_path / "options_form.html").write_text("<p>{{ models | length }} models, limit {{ limit }}</p>")
    assert render(paths=[str(tmp_path)]) == "<p>2 models, limit 2</p>"
