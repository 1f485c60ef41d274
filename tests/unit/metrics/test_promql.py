from kneepoint.metrics import promql


def test_window_queries_select_the_engine_pods_both_ways():
    queries = {q.name: q.expr for q in promql.window_queries("team-a", "exp-tp2-pp1", 95)}
    assert set(queries) == {promql.FB_USED, promql.KV_USAGE, promql.PREEMPTIONS, promql.GPU_UTIL, promql.NVLINK_TX}
    fb = queries[promql.FB_USED]
    assert 'namespace="team-a"' in fb and 'exported_namespace="team-a"' in fb
    assert "max_over_time(DCGM_FI_DEV_FB_USED{" in fb and "[95s]" in fb
    pre = queries[promql.PREEMPTIONS]
    assert pre.startswith("sum(") and "max_over_time(vllm:num_preemptions_total{" in pre and "min_over_time(" in pre


def test_range_covers_two_scrapes_for_short_windows():
    assert promql.range_seconds(100.0, 103.0, 15.0) == 30
    assert promql.range_seconds(100.0, 400.2, 15.0) == 301


def test_label_values_are_escaped():
    a, b = promql.pod_selectors('we"ird', "p")
    assert 'namespace="we\\"ird"' in a


def test_trace_queries_take_the_sidecars_last_value_and_no_simulator_only_metric_is_left():
    queries = {q.name: q.expr for q in promql.trace_queries("team-a", "exp-tp2-pp1", 120)}
    assert set(queries) == {"kneepoint_comm_fraction", "kneepoint_rank_skew_fraction"}
    assert (
        queries[promql.COMM_FRACTION] == r'max(last_over_time(kneepoint_comm_fraction{namespace="team-a",pod=~"exp\\-tp2\\-pp1-.*"}[120s]))'
    )
    names = [v for k, v in vars(promql).items() if k.isupper() and isinstance(v, str)]
    assert not [n for n in names if "sim" in n.lower()], names
