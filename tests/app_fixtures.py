"""A tiny preset written into a temporary folder, so app tests need no shipped artefacts."""
import json
import random
from pathlib import Path

from calm_core import CALMConfig, ComposedLM
from calm_core.models.tiny import char_tokenizer, tiny_model


def write_large_csv(path: Path, rows: int, letters: int = 4) -> Path:
    """A valid prompt,completion CSV of `rows` distinct reversal examples (`abcd=` -> `dcba`)."""
    with open(path, "w") as f:
        f.write("prompt,completion\n")
        for i in range(rows):
            word = "".join("abcdef"[(i >> (2 * k)) % 6] for k in range(letters))
            f.write(f"{word}=,{word[::-1]}\n")
    return path


def write_tiny_preset(root: Path, name: str = "tiny") -> Path:
    folder = root / name
    tok = char_tokenizer()
    anchor = tiny_model("gpt2", len(tok), layers=2, width=32, seed=1)
    augment = tiny_model("llama", len(tok), layers=2, width=32, seed=2)
    for sub, model in (("anchor", anchor), ("augment", augment)):
        model.save_pretrained(folder / sub)
        tok.save_pretrained(folder / sub)
    ComposedLM((anchor, tok), [(augment, tok)], CALMConfig(every=1)).save_pretrained(folder / "bridge")
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdef") for _ in range(4)) for _ in range(60)]
    (folder / "data").mkdir()
    for split, chunk in (("train", words[:40]), ("validation", words[40:50]), ("test", words[50:])):
        rows = [json.dumps({"prompt": w + "=", "completion": w[::-1]}) for w in chunk]
        (folder / "data" / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    (folder / "preset.json").write_text(json.dumps({
        "title": "Tiny test pair", "description": "random tiny models", "example_prompts": ["abcd=", "fed="],
        "eval_files": {"reverse (held out)": "data/test.jsonl"}, "max_new_tokens": 6,
        "table": {"KV-MATH": {"m_A": 1.0, "m_B": 0.0, "CALM": 50.0}},
        "paper_table": {"KV-MATH": {"m_A": 0.7, "m_B": 0.0, "CALM": 84.3}},
        "paper_table_title": "The tiny table beside the paper's", "metrics": ["exact_match", "chrf"],
        "train": {"steps": 30, "lr": 0.002, "batch_size": 8, "gate_lr_scale": 10.0, "augment_noise": 0.0,
                  "position_lr_scale": 3.0},
    }))
    return folder


if __name__ == "__main__":
    import sys

    write_tiny_preset(Path(sys.argv[1]))
