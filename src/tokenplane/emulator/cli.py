"""``tokenplane emulate``: serve one emulated GPU instance (vLLM's API and metrics) on a port."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from aiohttp import web
from aiohttp.log import access_logger

from tokenplane.emulator.instance import EmulatorSettings
from tokenplane.emulator.kv_transfer import KvTransferConfig, parse_kv_transfer_config
from tokenplane.emulator.metrics import RUNTIME_FLAVOURS
from tokenplane.emulator.server import create_app
from tokenplane.runloop import freeze_startup_objects, new_event_loop


def emulate(
    port: int = 8000,
    host: str = "127.0.0.1",
    gpu: str = "H100",
    model: str = "llama-3-8b",
    served_model_name: str | None = None,
    tp: int = 1,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 2048,
    kv_capacity_tokens: int | None = None,
    speed: float = 1.0,
    seed: int = 0,
    *,
    max_model_len: int | None = None,
    fixed_step_ms: float | None = None,
    default_max_tokens: int = 256,
    max_tokens_cap: int = 4096,
    enable_prefix_caching: bool = True,
    access_log: bool = False,
    runtime: str = "vllm",
    lora_modules: Sequence[str] = (),
    max_loras: int = 1,
    kv_transfer: KvTransferConfig | None = None,
    tokenizer: str | None = None,
    kv_events_endpoint: str | None = None,
) -> None:
    """Run the emulator until interrupted (uvloop when installed)."""
    settings = EmulatorSettings(
        gpu=gpu,
        model=model,
        served_model_name=served_model_name,
        tp=tp,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_capacity_tokens=kv_capacity_tokens,
        speed=speed,
        seed=seed,
        max_model_len=max_model_len,
        fixed_step_s=None if fixed_step_ms is None else fixed_step_ms / 1000.0,
        default_max_tokens=default_max_tokens,
        max_tokens_cap=max_tokens_cap,
        enable_prefix_caching=enable_prefix_caching,
        instance_id=f"emulated-{host}:{port}",
        lora_modules=tuple(lora_modules),
        max_loras=max_loras,
        kv_transfer=kv_transfer,
        tokenizer=tokenizer,
        kv_events_endpoint=kv_events_endpoint,
    )
    print(
        f"tokenplane emulate: serving {settings.model_name!r} ({model} on {tp} x {gpu}, speed {speed}) "
        f"on http://{host}:{port}",
        flush=True,
    )
    app = create_app(settings, runtime)
    app.on_startup.append(freeze_startup_objects)  # a GPU's steps do not pause for the collector
    web.run_app(
        app,
        host=host,
        port=port,
        handler_cancellation=True,
        access_log=access_logger if access_log else None,
        print=None,
        loop=new_event_loop(),
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tokenplane.emulator",
        description="Serve one emulated GPU instance with vLLM's OpenAI API and metric names.",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--gpu", default="H100")
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-capacity-tokens", type=int, default=None)
    p.add_argument("--speed", type=float, default=1.0, help="virtual seconds per wall second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument(
        "--fixed-step-ms", type=float, default=None, help="constant step time instead of the model"
    )
    p.add_argument("--default-max-tokens", type=int, default=256)
    p.add_argument("--max-tokens-cap", type=int, default=4096)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--access-log", action="store_true")
    p.add_argument(
        "--runtime",
        choices=RUNTIME_FLAVOURS,
        default="vllm",
        help="whose metric names /metrics publishes (the gateway instance's kind to match)",
    )
    p.add_argument("--lora-modules", nargs="*", default=[], help="LoRA adapter names served as models")
    p.add_argument("--max-loras", type=int, default=1, help="adapters resident at once")
    p.add_argument(
        "--kv-transfer-config",
        type=parse_kv_transfer_config,
        default=None,
        help='vLLM\'s flag: \'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\' plays P/D roles',
    )

    p.add_argument("--tokenizer", default=None, help="a tokenizer folder: tokenize prompts as vLLM does")
    p.add_argument("--kv-events-endpoint", default=None, help="publish vLLM KV events to this ZMQ endpoint")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    a = build_parser().parse_args(argv)
    emulate(
        a.port,
        a.host,
        a.gpu,
        a.model,
        a.served_model_name,
        a.tp,
        a.max_num_seqs,
        a.max_num_batched_tokens,
        a.kv_capacity_tokens,
        a.speed,
        a.seed,
        max_model_len=a.max_model_len,
        fixed_step_ms=a.fixed_step_ms,
        default_max_tokens=a.default_max_tokens,
        max_tokens_cap=a.max_tokens_cap,
        enable_prefix_caching=not a.no_prefix_caching,
        access_log=a.access_log,
        runtime=a.runtime,
        lora_modules=a.lora_modules,
        max_loras=a.max_loras,
        kv_transfer=a.kv_transfer_config,
        tokenizer=a.tokenizer,
        kv_events_endpoint=a.kv_events_endpoint,
    )
