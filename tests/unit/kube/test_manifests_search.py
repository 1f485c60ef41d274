"""The concurrency search's children: its engine with a larger --max-num-seqs, its short load-test Jobs."""

from test_manifests import CTX, OWNER, spec

from kneepoint.core.actions import SearchLoad
from kneepoint.core.tiers import Tier
from kneepoint.kube import manifests


def _flag(args, name):
    return args[args.index(name) + 1]


def test_the_search_engine_runs_the_same_flags_with_its_own_max_num_seqs():
    for mode in ("Measure", "Simulate"):
        ladder = manifests.build_engine_deployment(spec(mode=mode), OWNER, Tier(1, 1), CTX)
        search = manifests.build_engine_deployment(spec(mode=mode), OWNER, Tier(1, 1), CTX, max_num_seqs=692)
        a = ladder["spec"]["template"]["spec"]["containers"][0]["args"]
        b = search["spec"]["template"]["spec"]["containers"][0]["args"]
        assert _flag(a, "--max-num-seqs") == "16" and _flag(b, "--max-num-seqs") == "692"
        assert [x for x in a if x != "16"] == [x for x in b if x != "692"], "nothing else differs"
        assert search["metadata"]["name"] == ladder["metadata"]["name"]


def test_a_search_point_is_the_same_workload_at_its_concurrency_one_repeat_no_profile():
    s = spec()
    ladder = manifests.build_load_test_job(s, OWNER, Tier(1, 1), 1, CTX)
    point = manifests.build_load_test_job(s, OWNER, Tier(1, 1), 101, CTX, SearchLoad(48, 144))
    a = ladder["spec"]["template"]["spec"]["containers"][0]["args"]
    b = point["spec"]["template"]["spec"]["containers"][0]["args"]
    assert point["metadata"]["name"] == "llama8b-tp1-pp1-load101"
    assert (_flag(b, "--concurrency"), _flag(b, "--num-requests"), _flag(b, "--repeats")) == ("48", "144", "1")
    assert "--profile-seconds" in a and "--profile-seconds" not in b
    for same in ("--input-len", "--output-len", "--seed", "--endpoint", "--model", "--api", "--warmup-requests"):
        assert _flag(a, same) == _flag(b, same)
