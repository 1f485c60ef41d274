"""Wrapper go.mod generation and build pins (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kneepoint.sandbox import binaries, gomod, pins


def test_kubernetes_wrapper_replaces_every_staging_module_with_the_published_version() -> None:
    build = pins.kubernetes_build("v1.36.3")
    text = gomod.wrapper_gomod(build)
    replaces = gomod.gomod_replaces(text)
    assert len(pins.STAGING_MODULES_1_36) == 33
    assert replaces == {f"k8s.io/{m}": f"k8s.io/{m} v0.36.3" for m in pins.STAGING_MODULES_1_36}
    # The 1.36 newcomers that wrappers usually forget.
    assert "k8s.io/cri-streaming" in replaces and "k8s.io/streaming" in replaces
    assert text.startswith("module kneepoint.sandbox/k8sbin\n\ngo 1.26.0\n\ngodebug default=go1.26\n")
    assert "\tk8s.io/kubernetes v1.36.3\n" in text
    for cmd in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"):
        assert f"\tk8s.io/kubernetes/cmd/{cmd}\n" in text
    assert build.binaries == ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


def test_a_patch_release_is_a_one_variable_change() -> None:
    replaces = gomod.gomod_replaces(gomod.wrapper_gomod(pins.kubernetes_build("v1.36.6")))
    assert set(replaces.values()) == {f"k8s.io/{m} v0.36.6" for m in pins.STAGING_MODULES_1_36}
    with pytest.raises(ValueError, match=r"1\.40"):
        pins.kubernetes_build("v1.40.0")


def test_version_stamp_matches_upstream_keys_for_both_version_packages() -> None:
    flags = pins.kubernetes_ldflags("v1.36.3", "2026-11-29T00:00:00Z")
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {pkg}.gitVersion=v1.36.3" in flags
        assert f"-X {pkg}.gitMajor=1" in flags
        assert f"-X {pkg}.gitMinor=36" in flags
        assert f"-X {pkg}.gitTreeState=clean" in flags
    assert flags.startswith("-s -w ")


def test_etcd_and_kwok_wrappers_have_no_replaces() -> None:
    for build, module in ((pins.etcd_build(), "go.etcd.io/etcd/server/v3 v3.6.16"), (pins.kwok_build(), "sigs.k8s.io/kwok v0.8.0")):
        text = gomod.wrapper_gomod(build)
        assert "replace" not in text and "godebug" not in text
        assert f"\t{module}\n" in text
    assert dict(pins.etcd_build().outputs) == {"etcd": "go.etcd.io/etcd/server/v3"}


def test_prometheus_release_maps_to_its_module_version() -> None:
    assert pins.prometheus_module_version("v3.16.0") == "v0.316.0"
    assert pins.prometheus_module_version("3.5.2") == "v0.305.2"
    with pytest.raises(ValueError):
        pins.prometheus_module_version("v2.42.0")
    build = pins.prometheus_build()
    assert "enable_kubernetes_sd" in build.tags and "remove_all_sd" in build.tags


def test_replace_parser_reads_single_line_and_block_forms() -> None:
    text = "module x\nreplace a => b v1\nreplace (\n\tc => d v2 // why\n)\nrequire e v3\n"
    assert gomod.gomod_replaces(text) == {"a": "b v1", "c": "d v2"}


def test_cache_layout_is_bin_and_build_per_name_and_version(tmp_path: Path) -> None:
    env = {"KNEEPOINT_CACHE_DIR": str(tmp_path)}
    build = pins.kubernetes_build()
    assert binaries.bin_dir(build, env) == tmp_path / "bin" / "k8s-v1.36.3"
    assert binaries.build_dir(build, env) == tmp_path / "build" / "k8s-v1.36.3"
    assert binaries.missing_binaries(build, env) == list(build.binaries)
    (tmp_path / "bin" / "k8s-v1.36.3").mkdir(parents=True)
    kubectl = tmp_path / "bin" / "k8s-v1.36.3" / "kubectl"
    kubectl.write_text("#!/bin/sh\n")
    kubectl.chmod(0o755)
    assert "kubectl" not in binaries.missing_binaries(build, env)


def test_a_hand_tidied_module_from_the_same_recipe_is_recognised() -> None:
    build = pins.kubernetes_build()
    tidied = gomod.wrapper_gomod(build).replace(
        "require (\n\tk8s.io/kubernetes v1.36.3\n)",
        "require (\n\tcel.dev/expr v0.25.1 // indirect\n\tk8s.io/kubernetes v1.36.3 // indirect\n)",
    )
    assert binaries._same_pins(build, tidied)
    assert not binaries._same_pins(pins.kubernetes_build("v1.36.4"), tidied)
