from hypothesis import given
from hypothesis import strategies as st

from kneepoint.kube.status_patch import merge_patch


def apply_merge_patch(target, patch):
    """RFC 7386 applied, to check the generated patch round-trips."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


def test_removed_keys_become_null_and_lists_replace():
    old = {"phase": "Profiling", "waitingFor": "GPUs", "tiers": [{"name": "a"}], "decision": {"rule": "x", "replicas": 2}}
    new = {"phase": "Decided", "tiers": [{"name": "a"}, {"name": "b"}], "decision": {"rule": "y"}}
    patch = merge_patch(old, new)
    assert patch == {
        "waitingFor": None,
        "phase": "Decided",
        "tiers": [{"name": "a"}, {"name": "b"}],
        "decision": {"replicas": None, "rule": "y"},
    }
    assert apply_merge_patch(old, patch) == new


def test_equal_documents_give_empty_patch():
    doc = {"a": {"b": [1, 2]}, "c": 3}
    assert merge_patch(doc, doc) == {}


json_leaf = st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.lists(st.integers(), max_size=3))
json_doc = st.recursive(json_leaf, lambda children: st.dictionaries(st.text(min_size=1, max_size=4), children, max_size=4), max_leaves=12)


@given(
    st.dictionaries(st.text(min_size=1, max_size=4), json_doc, max_size=5),
    st.dictionaries(st.text(min_size=1, max_size=4), json_doc, max_size=5),
)
def test_patch_turns_old_into_new(old, new):
    assert apply_merge_patch(old, merge_patch(old, new)) == new
