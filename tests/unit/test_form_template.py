"""The spawn form template: what it shows for a given summary (pure rendering),
read back through a small HTML tree (stdlib parser) rather than by substrings."""

from __future__ import annotations

from dataclasses import replace
from html.parser import HTMLParser

import pytest

from gpuspawner.allocator.allocator import ModelSummary
from gpuspawner.spawn.form import _templates, last_choice, model_flags

GTX = ModelSummary("NVIDIA GeForce GTX 1070", 8192, total=4, free=0, largest_block=0, unavailable=0)
A100 = ModelSummary("NVIDIA A100 80GB PCIe", 81920, total=8, free=3, largest_block=2, unavailable=2)

VOID = {"input", "br", "img", "meta", "link", "hr"}


class Node:
    def __init__(self, tag: str, attrs: dict, parent: Node | None):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []
        self.parts: list[str | Node] = []  # its text and its children, in document order

    @property
    def text(self) -> str:
        """The visible text, whitespace collapsed (scripts and hidden elements inside left out)."""
        parts = [p if isinstance(p, str) else p.text for p in self.parts if isinstance(p, str) or p.shown]
        return " ".join("".join(parts).split())

    @property
    def shown(self) -> bool:
        return self.tag != "script" and "hidden" not in self.attrs

    def iter(self):
        for child in self.children:
            yield child
            yield from child.iter()

    def find_all(self, tag: str | None = None, **attrs) -> list[Node]:
        return [
            n
            for n in self.iter()
            if (tag is None or n.tag == tag) and all(n.attrs.get(k.rstrip("_")) == v for k, v in attrs.items())
        ]

    def by_id(self, id_: str) -> Node:
        (node,) = self.find_all(id=id_)
        return node

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class _TreeBuilder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.current = Node("#root", {}, None)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: ("" if v is None else v) for k, v in attrs}, self.current)
        self.current.children.append(node)
        self.current.parts.append(node)
        if tag not in VOID:
            self.current = node

    def handle_endtag(self, tag):
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        assert node is not None and node.parent is not None, f"unbalanced </{tag}>"
        self.current = node.parent

    def handle_data(self, data):
        self.current.parts.append(data)


def render_html(paths=(), **kw) -> str:
    ctx = dict(models=[A100, GTX], max_count=2, limit=2, held=0, room=2, hosts=[], selected=None, error="")
    ctx.update(kw)
    ctx.setdefault("flags", model_flags(ctx["models"], ctx["room"], ctx["max_count"], ctx.get("share_choices")))
    return _templates(tuple(paths)).get_template("options_form.html").render(**ctx)


def render(**kw) -> Node:
    builder = _TreeBuilder()
    builder.feed(render_html(**kw))
    builder.close()
    assert builder.current is builder.root, "an element was left open"
    return builder.root


def radio(form: Node, model: str) -> Node:
    (node,) = form.find_all("input", name="gpu_model", value=model)
    return node


def label_of(form: Node, control: Node) -> Node:
    (label,) = form.find_all("label", for_=control.attrs["id"])
    return label


def help_of(form: Node, control: Node) -> str:
    return " ".join(form.by_id(i).text for i in control.attrs["aria-describedby"].split())


def test_each_model_shows_its_memory_and_what_is_free_now():
    form = render()
    a100, gtx = radio(form, A100.model), radio(form, GTX.model)
    assert label_of(form, a100).text == A100.model
    assert (
        help_of(form, a100)
        == "80 GiB memory · 3 of 8 free now, up to 2 on one host (2 on hosts that are down, drained or paused)"
    )
    assert help_of(form, gtx) == "8 GiB memory · 0 of 4 free now"


@pytest.mark.parametrize("mib, shown", [(8192, "8 GiB"), (12800, "12.5 GiB"), (11178, "10.9 GiB"), (81920, "80 GiB")])
def test_memory_in_gib_without_needless_decimals(mib, shown):
    model = ModelSummary("X", mib, total=1, free=1, largest_block=1, unavailable=0)
    form = render(models=[model])
    assert help_of(form, radio(form, "X")).startswith(shown + " memory ·")


def test_a_model_with_none_free_says_so_and_can_be_chosen_to_wait_in_line():
    form = render()
    gtx, a100 = radio(form, GTX.model), radio(form, A100.model)
    assert "disabled" not in gtx.attrs and "disabled" not in a100.attrs
    assert "bg-body-tertiary" in gtx.parent.classes() and "bg-body-tertiary" not in a100.parent.classes()
    badges = [b.text for b in form.find_all("span") if "badge" in b.classes()]
    assert badges == ["3 free", "none free"]
    (wait,) = form.find_all("input", name="gpu_wait")
    assert wait.attrs["type"] == "checkbox" and "checked" not in wait.attrs
    assert form.find_all("label", for_="gpu-wait")[0].text == "If none is free, wait in line"
    assert "checked" in render(wait_checked=True).find_all("input", name="gpu_wait")[0].attrs


def test_a_model_with_none_free_is_disabled_when_the_user_may_hold_no_more():
    form = render(room=0)
    assert "disabled" in radio(form, GTX.model).attrs and "disabled" not in radio(form, A100.model).attrs


def test_a_model_whose_devices_are_all_on_hosts_that_are_down_is_disabled():
    down = ModelSummary("NVIDIA GeForce GTX 1070", 8192, total=4, free=0, largest_block=0, unavailable=4)
    assert "disabled" in radio(render(models=[A100, down]), down.model).attrs


def test_no_model_is_offered_when_the_user_may_hold_no_more():
    form = render(models=[A100], max_count=0, held=2, room=0)
    assert "disabled" in radio(form, A100.model).attrs
    assert form.find_all("select") == []
    assert (
        form.by_id("gpu-count-help").text
        == "You hold 2 GPUs, your limit: stop one of your other servers to use a GPU here."
    )


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"limit": 0, "max_count": 0}, "Your servers here are CPU-only."),
        ({"models": [GTX], "max_count": 0}, "No GPU is free right now; you can start a CPU-only server."),
    ],
)
def test_why_no_count_can_be_chosen(kw, message):
    form = render(**kw)
    assert form.by_id("gpu-count-help").text == message
    assert "checked" in radio(form, "").attrs  # CPU-only still starts


def test_every_control_has_a_label_and_ids_are_unique():
    form = render(hosts=["gpu-a"])
    ids = [n.attrs["id"] for n in form.iter() if "id" in n.attrs]
    assert len(ids) == len(set(ids))
    controls = form.find_all("input") + form.find_all("select")
    assert len(controls) == 6  # no GPU, two models, wait, count, host
    for control in controls:
        assert label_of(form, control).text, control.attrs
        for ref in control.attrs.get("aria-describedby", "").split():
            assert form.by_id(ref).text
    assert label_of(form, form.by_id("gpu-count")).text == "Number of GPUs"
    assert label_of(form, form.by_id("gpu-host")).text == "Host"


def test_the_choices_are_one_named_group_in_a_fieldset_with_a_legend():
    # A radio group in a fieldset: arrow keys move between models, Tab to the count.
    form = render()
    (fieldset,) = form.find_all("fieldset")
    assert [n.text for n in fieldset.find_all("legend")] == ["GPU"]
    radios = fieldset.find_all("input", type="radio")
    assert {r.attrs["name"] for r in radios} == {"gpu_model"}
    assert [r.attrs["value"] for r in radios] == ["", A100.model, GTX.model]


def test_works_without_javascript():
    # Everything the hub needs is in plain form fields: a radio is checked, the count
    # offers every number up to the limit, and nothing starts hidden or disabled by script.
    form = render()
    assert "checked" in radio(form, "").attrs
    count = form.by_id("gpu-count")
    assert count.attrs["name"] == "gpu_count" and "disabled" not in count.attrs
    assert [o.attrs["value"] for o in count.find_all("option")] == ["1", "2"]
    assert radio(form, A100.model).attrs["data-max"] == "2"  # what the script narrows to


def test_the_last_choice_is_preselected_with_its_count():
    form = render(selected=A100.model, last_count=2)
    assert "checked" in radio(form, A100.model).attrs and "checked" not in radio(form, "").attrs
    assert [o.attrs["value"] for o in form.by_id("gpu-count").find_all("option") if "selected" in o.attrs] == ["2"]
    # The line is not suggested for a model that is free (the script shows both when one is not).
    assert "hidden" in form.by_id("gpu-wait-hint").attrs and "hidden" in form.by_id("gpu-wait-now").attrs


def test_a_last_choice_with_none_free_is_kept_and_the_line_is_suggested():
    flags = model_flags([A100, GTX], 2, 2, None)
    assert flags[GTX.model] == (False, True)  # none free, but it may be chosen to wait for it
    choice = last_choice({"gpu_model": GTX.model, "gpu_count": 1}, flags, 2, [])
    assert choice == {"selected": GTX.model, "last_count": 1, "last_share": None, "wait_hint": True}
    form = render(**choice)
    assert "checked" in radio(form, GTX.model).attrs and "disabled" not in radio(form, GTX.model).attrs
    assert form.by_id("gpu-wait-hint").text == (
        f"None of the {GTX.model} you chose is free right now: tick this to wait in line for one, or"
    )
    button = form.by_id("gpu-wait-now")  # one click: ticks gpu_wait and submits the same choice
    assert (button.tag, button.attrs["type"], button.text) == ("button", "button", "Wait in line for it")
    # Not a submit button: Enter in the form still means JupyterHub's Start.
    assert all(b.attrs.get("type") != "submit" for b in form.find_all("button"))
    # The share chosen last, where the form offers it.
    shared = last_choice({"gpu_model": GTX.model, "gpu_share": 0.5}, flags, 2, ["0.25", "0.5"])
    assert shared["last_share"] == "0.5"
    assert last_choice({"gpu_model": GTX.model, "gpu_share": 0.75}, flags, 2, ["0.25", "0.5"])["last_share"] is None
    share_select = render(share_choices=["0.25", "0.5"], **shared).by_id("gpu-share")
    assert [o.attrs["value"] for o in share_select.find_all("option") if "selected" in o.attrs] == ["0.5"]
    # A model that cannot be chosen is not preselected (a disabled radio is not sent).
    cannot = model_flags([A100, GTX], 0, 0, None)
    assert last_choice({"gpu_model": GTX.model}, cannot, 0, [])["selected"] is None
    assert last_choice({"gpu_model": GTX.model, "gpu_wait": True}, flags, 2, [])["wait_hint"] is False


def test_jupyterhub_bootstrap_classes():
    form = render(hosts=["gpu-a"])
    assert all("form-check-input" in r.classes() for r in form.find_all("input"))
    assert all("form-select" in s.classes() for s in form.find_all("select"))
    assert "list-group" in form.find_all("fieldset")[0].children[2].classes()


def test_host_choice_and_error_are_shown_escaped():
    html = render_html(hosts=["gpu-a"], error="<b>cluster</b> unreachable")
    assert '<option value="gpu-a">gpu-a</option>' in html
    assert "&lt;b&gt;cluster&lt;/b&gt; unreachable" in html
    form = render(hosts=["gpu-a"], error="<b>cluster</b> unreachable")
    (alert,) = [d for d in form.find_all("div") if "alert" in d.classes()]
    assert alert.attrs["role"] == "alert" and alert.text == "<b>cluster</b> unreachable"


def test_model_names_are_escaped():
    odd = ModelSummary('GPU "<x>"', 1024, total=1, free=1, largest_block=1, unavailable=0)
    html = render_html(models=[odd])
    assert "<x>" not in html
    assert radio(render(models=[odd]), 'GPU "<x>"')


def test_host_choice_is_off_by_default():
    assert render().find_all("select", name="gpu_host") == []


def test_admin_template_folder_overrides_the_form(tmp_path):
    (tmp_path / "options_form.html").write_text("<p>{{ models | length }} models, limit {{ limit }}</p>")
    assert render_html(paths=[str(tmp_path)]) == "<p>2 models, limit 2</p>"


def test_shares_are_offered_for_shareable_models_with_what_they_mean():
    from gpuspawner.spawn.form import SHARE_NOTES, _share_choices

    full_but_shareable = ModelSummary(
        "NVIDIA A100 80GB PCIe",
        81920,
        total=2,
        free=0,
        largest_block=0,
        unavailable=0,
        shareable=True,
        quantum=250,
        split=False,
        largest_milli=500,
    )
    choices = _share_choices([full_but_shareable, GTX], 2000)
    assert choices == ["0.25", "0.5"]  # no more than one device has free, without split
    form = render(
        models=[full_but_shareable, GTX],
        max_count=0,
        room=2,
        share_choices=choices,
        share_note=SHARE_NOTES["none"],
    )
    a100 = radio(form, full_but_shareable.model)
    assert "disabled" not in a100.attrs  # no whole GPU free, but a share is
    assert "can be shared: up to 0.5 of one GPU free" in help_of(form, a100)
    assert "disabled" not in radio(form, GTX.model).attrs  # none free: it can be waited for
    select = form.by_id("gpu-share")
    assert label_of(form, select).text == "Or a share of a GPU"
    assert [o.attrs["value"] for o in select.find_all("option")] == ["", "0.25", "0.5"]
    assert "without isolation" in help_of(form, select)
    assert render(share_choices=[]).find_all(id="gpu-share") == []  # no sharing: no share control


GTX_SHARED = ModelSummary(
    "NVIDIA GeForce GTX 1070",
    8192,
    total=3,
    free=0,
    largest_block=0,
    unavailable=0,
    shareable=True,
    quantum=100,
    split=True,
    largest_milli=300,
)


def test_the_form_says_what_is_offered_whole_gpus_or_shares_of_a_model():
    """Guards docs/sharing.md: "With a model shared, the form says so above the models ("A
    server gets whole GPUs of one model, all on one host, or a share of a GPU of NVIDIA
    GeForce GTX 1070.")"."""
    whole = render().by_id("gpu-offered").text
    assert (
        whole
        == "Free counts are as of when this page was loaded. Each server gets whole GPUs of one model, all on one host."
    )
    form = render(models=[A100, GTX_SHARED], share_choices=["0.1", "0.2"])
    assert form.by_id("gpu-offered").text == (
        "Free counts are as of when this page was loaded. A server gets whole GPUs of one model, all on one host,"
        f" or a share of a GPU of {GTX_SHARED.model}."
    )
    assert "Each server gets whole GPUs of one model" not in form.text
    two = render(models=[replace(A100, shareable=True, quantum=250), GTX_SHARED], share_choices=["0.25"])
    assert two.by_id("gpu-offered").text.endswith(f"or a share of a GPU of {A100.model} or {GTX_SHARED.model}.")


def test_the_page_carries_what_the_script_needs_to_suggest_the_line_at_once():
    """Guards docs/line.md: "The form suggests the line as soon as a model with none free is
    chosen, or a share larger than any one device of the model has free: it says what the
    refusal would, with the Wait in line for it button, before Start is pressed"."""
    form = render(models=[A100, GTX_SHARED], share_choices=["0.1", "0.5"])
    a100, gtx = radio(form, A100.model), radio(form, GTX_SHARED.model)
    assert (a100.attrs["data-free"], gtx.attrs["data-free"]) == ("3", "0")
    # A share of at most one GPU must fit on one device: the most one has free, in thousandths.
    assert (gtx.attrs["data-device-room"], gtx.attrs["data-device-room-text"]) == ("300", "0.3")
    assert "data-device-room" not in a100.attrs and "data-split-small" not in gtx.attrs  # A100: not shared
    spans = radio(render(models=[replace(GTX_SHARED, split_small=True)], share_choices=["0.1"]), GTX_SHARED.model)
    assert "data-split-small" in spans.attrs  # may span devices: the page cannot tell whether it fits
    # Whole GPUs may wait only where the user may hold one more.
    assert "data-whole" in form.find_all("div", class_="gpuspawner-form")[0].attrs
    assert "data-whole" not in render(room=0.5).find_all("div", class_="gpuspawner-form")[0].attrs
    # The sentences the script fills in, and the hint and button it shows: hidden until then.
    why = form.by_id("gpu-wait-why")
    assert why.attrs["data-whole"] == "None of the {model} you chose is free right now"
    assert why.attrs["data-share"] == "No {model} has {share} of a GPU free right now (at most {room} on one device)"
    assert "hidden" in form.by_id("gpu-wait-hint").attrs and "hidden" in form.by_id("gpu-wait-now").attrs
    assert "gpu-wait-hint" not in form.by_id("gpu-wait").attrs["aria-describedby"]
