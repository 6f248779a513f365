"""gpu_access: the rules per group, checked; a user's most generous merge; what
a request the rules forbid is told.

Guards docs/access.md, "Tests": "The rules, their merge and the sentences are checked table by table
and as a property over random rules"."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuspawner.core.access import Access, AccessRules

A100 = "NVIDIA A100 80GB PCIe"
GTX = "NVIDIA GeForce GTX 1070"
MODELS = [GTX, A100]
ISSUE = {
    "students": {"models": [GTX], "max_gpus": 1, "max_hours": 4, "weekly_gpu_hours": 20},
    "staff": {"models": "*", "max_gpus": 4, "priority": 10},
    "*": {"models": [], "max_gpus": 0},
}


def rules(config=ISSUE, default=1, aliases=None) -> AccessRules:
    return AccessRules.parse(config, default_max_gpus=default, aliases=aliases)


@pytest.mark.parametrize(
    "groups, models, max_gpus, priority, max_hours, weekly",
    [
        # in no listed group: "*"'s rules (max_hours: the hub's own, 0 here: none)
        ([], frozenset(), 0, 0, 0.0, None),
        (["physics"], frozenset(), 0, 0, 0.0, None),
        (["students"], frozenset({GTX}), 1, 0, 4.0, 20.0),
        (["staff"], None, 4, 10, 0.0, None),
        # both: every model, 4 GPUs, priority 10, no hour limits (staff has none)
        (["students", "staff"], None, 4, 10, 0.0, None),
        (["students", "physics"], frozenset({GTX}), 1, 0, 4.0, 20.0),
    ],
)
def test_effective_is_the_most_generous_of_the_users_groups(groups, models, max_gpus, priority, max_hours, weekly):
    a = rules().effective(groups)
    assert (a.models, a.max_gpus, a.priority, a.resolved("max_hours", 0), a.weekly_gpu_hours) == (
        models,
        max_gpus,
        priority,
        max_hours,
        weekly,
    )


def test_numbers_merge_by_their_maximum_and_an_absent_limit_is_none():
    config = {
        "a": {"models": [GTX], "max_hours": 2, "weekly_gpu_hours": 10, "priority": -5, "idle_timeout": 600},
        "b": {"models": [A100], "max_hours": 8, "weekly_gpu_hours": 5, "max_gpus": 3, "idle_threshold": 5},
        "c": {"models": [A100], "idle_timeout": 1800, "idle_threshold": 2},
    }
    ab = rules(config).effective(["a", "b"])
    assert ab.models == frozenset({GTX, A100})
    assert (ab.max_hours, ab.weekly_gpu_hours, ab.max_gpus, ab.priority) == (8.0, 10.0, 3, 0)
    assert (ab.idle_timeout, ab.idle_threshold) == (600.0, 5.0)
    abc = rules(config).effective(["a", "b", "c"])
    assert abc.weekly_gpu_hours is None  # c sets no weekly limit
    # c leaves max_hours to the hub: its setting counts as c's value
    assert (abc.resolved("max_hours", 0), abc.resolved("max_hours", 5), abc.resolved("max_hours", 24)) == (0, 8, 24)
    assert (abc.idle_timeout, abc.idle_threshold) == (1800.0, 2.0)  # longest timeout, lowest threshold
    assert abc.groups == ("a", "b", "c")
    # max_gpus absent: the hub's max_gpus_per_user
    assert rules(config, default=2).effective(["a"]).max_gpus == 2


def test_without_rules_everybody_gets_every_model_and_the_hubs_limit():
    for config in ({}, None):
        a = rules(config, default=2).effective(["students"])
        assert a == Access(max_gpus=2)
        assert a.offered(MODELS) == MODELS
        assert a.refusal({"gpu_model": A100, "gpu_count": 2}, MODELS) is None
        # over the hub's limit: left to the options' own check (400 naming the limit), as without rules
        assert a.refusal({"gpu_model": A100, "gpu_share": 3}, MODELS) is None
        assert a.refusal({"gpu_model": A100, "gpu_count": 3}, MODELS) is None
    # rules without "*": users in no listed group are not restricted either
    outside = rules({"staff": {"max_gpus": 4}}, default=1).effective([])
    assert outside == Access(max_gpus=1) and outside.refusal({"gpu_model": A100, "gpu_count": 2}, MODELS) is None


def test_aliases_name_models_as_the_hub_shows_them():
    a = rules({"lab": {"models": [A100]}}, aliases={A100: "A100 80 GB"}).effective(["lab"])
    assert a.models == frozenset({"A100 80 GB"})
    assert rules({"lab": {"models": [A100, "Tesla T4"]}}).unknown_models(MODELS) == ["lab: Tesla T4"]


@pytest.mark.parametrize(
    "config, message",
    [
        ([1], "gpu_access must be a mapping of group name to its rules"),
        ({"": {}}, "group names must be non-empty strings"),
        ({"s": [GTX]}, "gpu_access['s'] must be a mapping with keys models, max_gpus"),
        ({"s": {"max_gpu": 1}}, "gpu_access['s']: unknown key(s) 'max_gpu'; valid keys: models, max_gpus"),
        ({"s": {"models": GTX}}, "gpu_access['s']['models'] must be \"*\" or a list of model names"),
        ({"s": {"models": [GTX, 3]}}, "gpu_access['s']['models'] must list model names (strings)"),
        ({"s": {"max_gpus": -1}}, "gpu_access['s']['max_gpus'] must be a whole number from 0 to 100000, got -1"),
        ({"s": {"max_gpus": 1.5}}, "gpu_access['s']['max_gpus'] must be a whole number from 0 to 100000, got 1.5"),
        ({"s": {"max_gpus": True}}, "gpu_access['s']['max_gpus'] must be a whole number from 0 to 100000, got True"),
        (
            {"s": {"priority": "high"}},
            "gpu_access['s']['priority'] must be a whole number from -1000000 to 1000000, got 'high'",
        ),
        ({"s": {"max_hours": 0}}, "gpu_access['s']['max_hours'] must be a number > 0 and at most 87600, got 0"),
        (
            {"s": {"weekly_gpu_hours": "20"}},
            "gpu_access['s']['weekly_gpu_hours'] must be a number > 0 and at most 16800000, got '20'",
        ),
        ({"s": {"weekly_gpu_hours": float("nan")}}, "must be a number > 0 and at most 16800000, got nan"),
        ({"s": {"max_hours": float("inf")}}, "must be a number > 0 and at most 87600, got inf"),
        ({"s": {"idle_timeout": -1}}, "gpu_access['s']['idle_timeout'] must be a number from 0 to 31536000, got -1"),
        ({"s": {"idle_threshold": 101}}, "gpu_access['s']['idle_threshold'] must be a number from 0 to 100, got 101"),
    ],
)
def test_bad_rules_are_refused_with_the_group_and_key(config, message):
    with pytest.raises(ValueError) as exc:
        rules(config)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    "groups, options, message",
    [
        (["students"], {"gpu_model": A100, "gpu_count": 1}, f"{A100} is not available to you. Your group"),
        (["students"], {"gpu_model": GTX, "gpu_count": 2}, "2 GPUs requested. Your group (students) allows"),
        (["students"], {"gpu_model": GTX, "gpu_share": 1.5}, "1.5 GPUs requested."),
        (["students"], {"gpu_count": 1}, "Choose a GPU model (gpu_model). Your group (students) allows"),
        ([], {"gpu_model": GTX}, "Users in none of the hub's GPU groups may have CPU-only servers only."),
        ([], {"gpu_count": "all"}, "CPU-only servers only."),
    ],
)
def test_a_forbidden_request_is_told_what_the_user_may_have(groups, options, message):
    refusal = rules().effective(groups).refusal(options, MODELS)
    assert refusal is not None and message in refusal
    if "students" in groups:
        assert refusal.endswith(f"allows {GTX}, up to 1 GPU at a time.")


@pytest.mark.parametrize(
    "groups, options",
    [
        ([], {}),
        ([], {"gpu_count": 0}),
        (["students"], {"gpu_model": GTX, "gpu_count": 1}),
        (["students"], {"gpu_model": GTX, "gpu_share": 0.5}),
        (["students"], {"gpu_model": "Tesla T4"}),  # unknown: parse_user_options's 400
        (["students"], {"gpu_model": GTX, "gpu_count": "two"}),  # malformed: parse_user_options's too
        (["staff"], {"gpu_model": A100, "gpu_count": 4}),
        (["staff"], {"gpu_count": 2}),
        (["staff"], "not a mapping"),
    ],
)
def test_what_the_rules_allow_is_not_refused_by_them(groups, options):
    assert rules().effective(groups).refusal(options, MODELS) is None


def test_the_sentence_names_what_each_user_may_have():
    r = rules()
    assert r.effective(["students", "staff"]).describe(MODELS) == (
        f"Your groups (staff, students) allow {GTX}, {A100}, up to 4 GPUs at a time."
    )
    assert r.effective(["students"]).offered(MODELS) == [GTX]
    assert r.effective(["students"]).offered([A100]) == []
    assert r.effective(["students"]).describe([A100]) == "Your group (students) allows CPU-only servers only."


# -- a property: joining a group never takes anything away ------------------------------

GROUPS = ["g0", "g1", "g2", "*"]
group_rules = st.fixed_dictionaries(
    {},
    optional={
        "models": st.one_of(st.just("*"), st.lists(st.sampled_from(MODELS + ["Tesla T4"]), max_size=3)),
        "max_gpus": st.integers(0, 8),
        "priority": st.integers(-5, 20),
        "max_hours": st.floats(0.5, 100),
        "weekly_gpu_hours": st.floats(0.5, 200),
        "idle_timeout": st.floats(0, 10_000),
        "idle_threshold": st.floats(0, 100),
    },
)


def _at_least_as_generous(more: Access, less: Access, hub: dict) -> bool:
    def unlimited_ge(a, b):
        return a is None or (b is not None and a >= b)

    def longer(key):  # 0: no limit
        a, b = more.resolved(key, hub[key]), less.resolved(key, hub[key])
        return a == 0 or (b != 0 and a >= b)

    models_ok = more.models is None or (less.models is not None and less.models <= more.models)
    return (
        models_ok
        and more.max_gpus >= less.max_gpus
        and more.priority >= less.priority
        and unlimited_ge(more.weekly_gpu_hours, less.weekly_gpu_hours)
        and longer("max_hours")
        and longer("idle_timeout")
        and more.resolved("idle_threshold", hub["idle_threshold"])
        <= less.resolved("idle_threshold", hub["idle_threshold"])
    )


@given(
    config=st.dictionaries(st.sampled_from(GROUPS), group_rules, max_size=4),
    groups=st.lists(st.sampled_from(GROUPS[:3] + ["other"]), max_size=3),
    extra=st.sampled_from(GROUPS[:3]),
    default=st.integers(0, 4),
    hub=st.fixed_dictionaries(
        {"max_hours": st.sampled_from([0, 1, 8, 200]), "idle_timeout": st.sampled_from([0, 60, 3600, 20_000])}
    ).map(lambda d: {**d, "idle_threshold": 5.0}),
)
def test_adding_a_listed_group_never_takes_anything_away(config, groups, extra, default, hub):
    """Also the limits a group leaves to the hub's own setting (whatever it is).

    Guards docs/access.md, "A user in several groups": "Joining another listed group never takes
    anything away, whatever the rules and the hub's own settings"."""
    r = AccessRules.parse(config, default_max_gpus=default)
    before, after = r.effective(groups), r.effective([*groups, extra])
    in_listed = any(g in config and g != "*" for g in groups)
    if in_listed or extra in config:
        # Leaving "everyone else" for a listed group is a change of rules, not a merge;
        # within listed groups, adding one only adds.
        if in_listed:
            assert _at_least_as_generous(after, before, hub), (before, after)
        if extra in config:
            assert _at_least_as_generous(after, r.effective([extra]), hub), (after, r.effective([extra]))
    else:
        assert after == before


def test_a_group_that_never_stops_idle_servers_is_not_undone_by_joining_one_that_does():
    """idle_timeout 0 is "never": joining a group with 3600 s does not stop the user
    after an hour; a group that leaves the idle settings to the hub counts the hub's."""
    config = {"never": {"idle_timeout": 0}, "hourly": {"idle_timeout": 3600, "idle_threshold": 20}, "plain": {}}
    both = rules(config).effective(["never", "hourly"])
    assert both.resolved("idle_timeout", 1800) == 0
    with_hub = rules(config).effective(["hourly", "plain"])  # plain: the hub's 7200 s and 5 %
    assert (with_hub.resolved("idle_timeout", 7200), with_hub.resolved("idle_threshold", 5)) == (7200, 5)
    assert (with_hub.resolved("idle_timeout", 600), with_hub.resolved("idle_threshold", 30)) == (3600, 20)
