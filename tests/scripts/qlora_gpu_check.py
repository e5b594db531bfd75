"""QLoRA on a CUDA GPU: a 4-bit base (``load_in_4bit: true``) under a LoRA adapter trains by GRPO.

Usage: python tests/scripts/qlora_gpu_check.py [OUT_DIR] [--precision 32-true bf16-mixed]

Run by tests/test_extending.py only where ``torch.cuda.is_available()`` (CI has no GPU); needs
``bitsandbytes``. Builds a small Qwen2-shaped model with random weights and a tokenizer (nothing
downloads), loads it with ``AgentPolicy(load_in_4bit=True)`` and, for each trainer precision, fits
one epoch of GRPO on examples/guess_number.py's env (rollouts through the engine's default
decode on a GPU, CUDA graphs). Checks: the base's linear layers are bitsandbytes ``Linear4bit``,
the loss is finite, the LoRA weights changed and the 4-bit base did not. Prints one ``OK`` line
per precision with the peak GPU memory, and exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from lightning.pytorch import Trainer
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))
from guess_number import GuessNumber  # noqa: E402

from lit_agents.agents import ReActAgent  # noqa: E402
from lit_agents.data import RolloutDataModule  # noqa: E402
from lit_agents.modules import GRPOPolicy  # noqa: E402
from lit_agents.policy import AgentPolicy  # noqa: E402
from lit_agents.tiny import build_tokenizer  # noqa: E402


def build_model(folder: Path) -> Path:
    """A Qwen2-shaped model (hidden 256, 4 layers, GQA) with random weights, and its tokenizer."""
    tokenizer = build_tokenizer(GuessNumber().corpus(), vocab_size=512)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def check(model: Path, precision: str, out: Path) -> str:
    import bitsandbytes as bnb

    torch.cuda.reset_peak_memory_stats()
    policy = AgentPolicy(str(model), load_in_4bit=True, lora_r=8, lora_targets="all-linear")
    four_bit = [m for m in policy.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(four_bit) == 4 * 7, f"expected 28 Linear4bit layers (4 layers x 7 projections), got {len(four_bit)}"
    loaded = torch.cuda.max_memory_allocated()
    lora = {n: p.detach().cpu().clone() for n, p in policy.named_parameters() if p.requires_grad}
    base = {n: p.detach().cpu().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    assert lora and all("lora_" in n for n in lora), "only LoRA weights should train"

    module = GRPOPolicy(policy, lr=1e-3, drop_zero_signal=False)
    module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))  # a signal whatever the rewards
    losses: list[float] = []
    step = module.training_step

    def recorded_step(batch, batch_idx):
        loss = step(batch, batch_idx)
        losses.append(loss.item())
        return loss

    module.training_step = recorded_step
    data = RolloutDataModule(GuessNumber(), ReActAgent(max_new_tokens=8, max_steps=3), tasks_per_epoch=2,
                             group_size=4, val_tasks=0)
    trainer = Trainer(max_epochs=1, accelerator="gpu", devices=1, precision=precision, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0, reload_dataloaders_every_n_epochs=1,
                      default_root_dir=out)
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    seconds = time.perf_counter() - start

    assert losses and all(torch.isfinite(torch.tensor(losses))), f"losses {losses}"
    after = {n: p.detach().cpu() for n, p in policy.named_parameters()}  # Lightning moves it back to the CPU
    assert any(not torch.equal(lora[n], after[n]) for n in lora), "no LoRA weight changed"
    assert all(torch.equal(base[n], after[n]) for n in base), "the frozen 4-bit base changed"
    generated = sum(r.num_generated for r in data.last_rollouts)
    return (f"OK qlora precision={precision}: {len(four_bit)} Linear4bit layers, {trainer.global_step} step(s), "
            f"loss {losses[0]:.4f}, {generated} tokens generated, fit {seconds:.1f}s, "
            f"memory after load {loaded / 2**20:.1f} MiB, peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--precision", nargs="+", default=["32-true", "bf16-mixed"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA GPU (QLoRA's 4-bit base runs on CUDA only)")
        return 0
    import bitsandbytes

    print(f"torch {torch.__version__}, bitsandbytes {bitsandbytes.__version__}, {torch.cuda.get_device_name()}")
    out = Path(args.out or tempfile.mkdtemp(prefix="qlora_"))
    model = build_model(out / "model")
    failed = 0
    for precision in args.precision:
        try:
            print(check(model, precision, out / precision), flush=True)
        except Exception:  # report every precision, then fail
            failed += 1
            print(f"FAILED qlora precision={precision}:\n{traceback.format_exc()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
