"""``rehearse.live`` after its split (the probe in ``rehearse.probe``, the driver in
``rehearse.driver``): its public names are still importable from it, and are the same objects."""

from __future__ import annotations

from tokenplane.rehearse import driver, live, probe


def test_the_public_names_stay_importable_from_live() -> None:
    assert live.PathProbe is probe.PathProbe and live.probe_path is probe.probe_path
    assert live.probe_prompt_sizes is probe.probe_prompt_sizes and live.PROBE_REQUESTS == probe.PROBE_REQUESTS
    assert live.LiveRun is driver.LiveRun and live.Driver is driver.Driver
    assert callable(live.drive_live) and callable(live.live_report)


def test_a_probe_summary_reads_its_three_places() -> None:
    got = live.PathProbe(
        client_ttft_s=[0.30, 0.32, 0.31],
        gateway_ttft_s=[0.20, 0.21, 0.22],
        instance_ttft_s=[0.10, 0.10, 0.12],
        prompt_tokens=[100, 200, 300],
    )
    assert abs(got.first_chunk_s - 0.20) < 1e-9  # median of (client - instance): 0.2, 0.22, 0.19
    summary = got.summary()
    assert summary["requests"] == 3 and summary["prompt_tokens_median"] == 200
    assert abs(summary["gateway_hop_s"] - 0.10) < 1e-9 and abs(summary["client_hop_s"] - 0.10) < 1e-9
