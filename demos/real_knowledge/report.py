"""table.md / table.json (and preset.json when asked) for a real-knowledge run."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from demos.fresh_runs import shipped_runs

from .scoring import COLUMNS, ROW_PERPLEXITY, general_rows, with_expected

PROTOCOL = ("Knowledge of a made-up world (invented people, each with a home town among invented towns) that only "
            "m_A has: m_A = Gemma 3 270M (base) + a LoRA adapter trained on encyclopedia sentences only; anchor = "
            "SmolLM2-135M-Instruct, frozen, never shown the world, asked in its own chat template. The bridge is "
            "trained on questions about 20% of the people (answer = {answer}) and on general questions answered "
            "by the anchor itself (rehearsal); early stopping and every setting were chosen on development people. "
            "Scored by {scoring}, greedy decoding, on questions about held-out test people who appear in no "
            "composition data.")
ANSWER_TOWN = ("a space and the town alone", "exact match on the town (first line of the answer, spaces and a final full "
               "stop removed)")
ANSWER_SENTENCE = ("m_A's own encyclopedia sentence 'NAME was born in TOWN.', the three question forms and, with "
                   "questions_per_person > 3, forms drawn from a small grammar (phrasings.py); invented names outside "
                   "the world, asked the same way, are trained toward the anchor's own answers", "whether the "
                   "answer's first line names the right town (a whole word)")


def protocol_text(settings: dict | None) -> str:
    """PROTOCOL for the run's answer style."""
    settings = settings or {}
    answer, scoring = ANSWER_SENTENCE if settings.get("answer_style") == "sentence" else ANSWER_TOWN
    if settings.get("unknown_answer") == "not_recorded":  # m_A was taught names outside the world as unknown
        answer = answer.replace("are trained toward the anchor's own answers", "are trained toward 'NAME was born "
                                "in an unknown town.', what m_A (also taught names outside the world as unknown) "
                                "predicts for them")
    return PROTOCOL.format(answer=answer, scoring=scoring)

COLUMN_NOTES = {
    "CALM": "anchor + m_A through the trained bridge",
    "anchor alone": "the same composition with the bridge off (gate scale 0): SmolLM2 exactly",
    "m_A alone (chat question)": "Gemma + adapter given the anchor's chat prompt as plain text",
    "m_A alone (best prompt)": "Gemma + adapter completing its own encyclopedia phrasing 'X was born in' "
                               "(the knowledge m_A holds; not the task as asked), scored as right when the continuation begins with "
                               "the town (m_A never learned to end it)",
    "anchor + LoRA (composition data)": "SmolLM2 + LoRA trained on the same composition data (questions and "
                                        "rehearsal), same batch; its steps are in the Controls line (by default as "
                                        "many as the bridge ran)",
    "CALM with untrained m_A": "plain Gemma (never saw the world) composed and trained the same way, "
                               "early stopping included",
}

DEPARTURES = [
    "The paper's key-value experiment composes PaLM2 models on numeric keys and values (25K keys) and evaluates "
    "arithmetic over them; here the facts are names -> towns, the models are 135M / 270M, and the task is recall "
    "only (no arithmetic), so no paper number is comparable.",
    "The questions hold the phrase that elicits the fact from m_A (e.g. 'X was born in which town?'), so that m_A "
    "computes the town in the text the bridge reads; m_A's encyclopedia uses the same phrase.",
    "Every town starts with a token of its own in both tokenizers and is cut into the same pieces by both (the "
    "world is drawn so), so the bridge carries one choice among the towns, not a spelling; the trained answer "
    "starts with a space (' Daikroze'), which makes SmolLM2 cut the name as m_A does (the scoring strips it).",
    "m_A was trained with the loss on the value tokens only (the encyclopedia sentence's name and phrasing given), "
    "two sentences to a row.",
]


def departures(settings: dict) -> list[str]:
    """DEPARTURES and the two that depend on the run's settings (the value path, the rehearsal loss)."""
    frozen = settings.get("value_lr_scale", 1.0) == 0
    value = ("The bridge's value path is a least-squares map between the two models' output vocabularies "
             "(calm_core/vocab_init.py), " + ("kept fixed: only where to read (queries, keys, recency biases, null "
             "keys) and the gates are trained" if frozen else "trained from there") + "; the paper's value path "
             "starts random and is trained. Recency biases and null keys train at "
             f"{settings.get('position_lr_scale', 1.0):g}x the learning rate (position_lr_scale).")
    kl = settings.get("rehearsal_kl", False)
    rehearsal = ("The composition data adds general questions answered by the anchor itself (rehearsal; none of "
                 "them is an evaluation prompt), " + ("on which the bridge is trained toward the anchor alone's "
                 "next-token distributions (KL, calm_core Example.keep_anchor)" if kl else "trained on the anchor's "
                 "greedy answers") + ", so that it learns to leave the anchor alone where m_A has nothing to add; "
                 "the paper's composition data is the task's alone.")
    first = DEPARTURES[:3]
    if settings.get("answer_style") == "sentence":
        first = [DEPARTURES[0], "The trained answer is m_A's own encyclopedia sentence ('NAME was born in TOWN.'): "
                 "whatever the question's words, the anchor writes the phrase that elicits the fact from m_A, and the "
                 "bridge reads m_A's prediction at the newest token; the paper's answers are the task's own.",
                 DEPARTURES[2].replace("; the trained answer starts with a space (' Daikroze'), which makes SmolLM2 "
                                       "cut the name as m_A does (the scoring strips it)", "")]
    return first + [value] + DEPARTURES[3:] + [rehearsal]


RESULTS = Path(__file__).parents[2] / "results" / "real_knowledge"  # data lives outside the code folder
FRESH_MARK = " Settings were chosen on world seed 0;"  # starts the sentence protocol() adds (relabel replaces it)
FRESH_WORLD_MARK = " This is world seed "  # starts the sentence a fresh world's run gets instead
MA_CHOSEN = "m_A's focused start on world seed 1 and its anneal on world seed 4, after that world's own run once"
# worlds 0-5 ran 600 bridge steps; the 360 of today were read off world 4's checks, after world 5 had run (README)
EARLIER_STEPS = 600
STEPS_CHOSEN = "the bridge's 360 steps on world seed 4's checks, after world seed 5's run"
RECENCY_CHOSEN = "the recency biases' start at the fact (recency_init) on world seed 6, after that world's own run once"


# the settings past those above that make a recipe (the shipped profile's, Settings.shipped): a fresh run's listing
# names each one it ran differently from today's defaults
RECIPE_FIELDS = ("questions_per_person", "answer_style", "unknown_rows", "unknown_answer", "augment_unknown",
                 "augment_unknown_epochs", "augment_famous", "check_every", "max_new_tokens", "rehearsal")


# runs before the eighth session have no value_answer_share: their map gave the answer tokens weight 100 (share 0.18)
EARLIER_SHARE = 0.18


def m_a_recipe(settings: dict) -> str:
    """How m_A was trained, in words: its start (plain or focused) and its end (an anneal, or stopped at a recall)."""
    focused = settings.get("augment_focus", 1.0) < 1 and settings.get("augment_focus_epochs", 0) > 0
    annealed = settings.get("augment_anneal_epochs", 0) > 0
    return ("focused start" if focused else "plain start") + (
        f", annealed over {settings['augment_anneal_epochs']} epochs from {settings.get('augment_anneal_at', 95.0):g}% recall"
        if annealed else f", stopped at {settings.get('target_recall', 99.0):g}% recall")


def current_m_a_recipe() -> str:
    """m_a_recipe of today's defaults."""
    from .settings import Settings

    return m_a_recipe(asdict(Settings()))


def setting_changes(settings: dict) -> list[str]:
    """How a shipped run's settings differ from today's defaults (those a seed-0 number is measured with)."""
    from .settings import Settings

    now, changes = Settings(), []
    then_recipe, now_recipe = m_a_recipe(settings), current_m_a_recipe()
    if then_recipe != now_recipe:
        changes.append(f"m_A {then_recipe}; now {now_recipe}")
    steps = settings.get("compose_steps", EARLIER_STEPS)
    if steps != now.compose_steps:
        changes.append(f"bridge {steps} steps, now {now.compose_steps}")
    start = settings.get("recency_init", 0.0)
    if start != now.recency_init:
        changes.append(f"recency biases started at {start:g} at the fact's distance, now {now.recency_init:g}")
    share = settings.get("value_answer_share", EARLIER_SHARE)
    if settings.get("value_init", True) and abs(share - now.value_answer_share) > 1e-9:
        changes.append(f"value map answer share {share:g}, now {now.value_answer_share:g}")
    for name in RECIPE_FIELDS:  # a field a run predates ran as its default (each was added with the old behaviour)
        then, default = settings.get(name, getattr(now, name)), getattr(now, name)
        if then != default:
            changes.append(f"{name} {json.dumps(then)}, now {json.dumps(default)}")
    if changes and all(settings.get(n, getattr(now, n)) == getattr(Settings.shipped(), n) for n in RECIPE_FIELDS):
        changes.insert(0, "the shipped profile (--settings shipped)")
    return changes


def fresh_worlds() -> list[tuple[int, float, list[str]]]:
    """(seed, CALM exact match % on held-out people, how its settings differ from today's) of the shipped
    fresh-world runs (results/real_knowledge/seedN), each run once with the settings of its day frozen."""
    return [(run["settings"]["seed"], run["table"]["exact match %, held-out entities"]["CALM"],
             setting_changes(run["settings"])) for run in shipped_runs(RESULTS, "seed")]


def fresh_sentence(settings: dict | None) -> str:
    """What a seed-0 number must be read with (the fresh worlds' numbers), or which fresh world this run is."""
    settings = settings or {}
    seed = settings.get("seed", 0)
    if seed:
        where = (f"the bridge's on world seed 0, {MA_CHOSEN}" if settings.get("augment_anneal_epochs", 0) > 0
                 else "on world seed 0")
        if settings.get("compose_steps", EARLIER_STEPS) != EARLIER_STEPS:
            where += f", {STEPS_CHOSEN}"
        if settings.get("recency_init", 0) > 0:
            where += f", {RECENCY_CHOSEN}"
        return f"{FRESH_WORLD_MARK}{seed}, run once with the settings frozen ({where}): a test set used once."
    runs = [r for r in fresh_worlds() if r[0]]
    if not runs:
        return ""
    parts = [f"seed {k} {v:.1f}%" + (f" ({'; '.join(c)})" if c else "") for k, v, c in runs]
    tail = (" No fresh world has been run with the current settings yet." if all(c for _, _, c in runs) else "")
    own, now = (m_a_recipe(settings) if settings else None), current_m_a_recipe()
    mine = f" This world's m_A: {own} (now: {now})." if own and own != now else ""
    return (FRESH_MARK + f" {MA_CHOSEN}; fresh worlds, each run once with the settings of their day frozen: "
            + ", ".join(parts) + " on held-out people." + tail + mine)


def protocol(settings: dict | None, development: str | None = None) -> str:
    """PROTOCOL and which run this is: `development` (a run's own table.json key, kept by relabel) says what a
    second look at a world tried, in place of the fresh-world sentence its seed would get."""
    return protocol_text(settings) + (f" {development}" if development else fresh_sentence(settings))


def own_description(text: str) -> str:
    """A preset description without the sentence fresh_sentence() added (either kind)."""
    return text.split(FRESH_MARK)[0].split(FRESH_WORLD_MARK)[0]


def relabel(out: Path) -> None:
    """Rewrite table.json / table.md (and preset.json's description) of a run folder from its table.json: the
    measured numbers as they are, the labels from this module."""
    out = Path(out)
    result = json.loads((out / "table.json").read_text())
    write(out, result)
    meta_path = out / "preset.json"
    if meta_path.is_file() and not result.get("development"):  # a second look keeps its own sentence
        meta = json.loads(meta_path.read_text())
        meta["description"] = own_description(meta["description"]) + fresh_sentence(result.get("settings"))
        meta_path.write_text(json.dumps(meta, indent=1))


def fmt(v) -> str:
    return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))


def markdown(result: dict) -> str:
    table = result["table"]
    cols = [c for c in COLUMNS if any(c in row for row in table.values())]
    lines = ["| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for name, row in table.items():
        lines.append(f"| {name} | " + " | ".join(fmt(row.get(c)) for c in cols) + " |")
    g = result["general"]
    t = result["times_s"]
    hist = (result.get("augment") or {}).get("history") or []
    if hist:
        last = hist[-1]
        lines += ["", f"m_A (Gemma 3 270M + LoRA): {last['epoch']} epochs over the encyclopedia in "
                  f"{last['minutes']:.1f} min (wall, 2 CPU cores), teacher-forced recall of the town "
                  f"{last['recall']:.1f}% ('X was born in' -> town, sampled people), value-token loss {last['loss']:.2f}."]
    b = result.get("bridge") or {}
    if b.get("checks"):
        lines += ["", f"Bridge: {b.get('bridge_parameters', 0) / 1e6:.1f}M parameters; kept the check at step "
                  f"{b['best_step']} of {b['steps_run']} run (development exact match {b['best_dev_exact']:.1f}%; "
                  "checks: " + ", ".join(f"{c['step']}: {c['dev_exact']:.0f}%" for c in b["checks"]) + ")."]
    for name, forms in (result.get("by_form") or {}).items():
        lines += ["", f"{name} on held-out people, by question form: " +
                  "; ".join(f"'{f.format(x='X')}' {v:.1f}%" for f, v in forms.items())]
    c = result.get("controls") or {}
    if c.get("finetune") or c.get("untrained"):
        parts = []
        if c.get("finetune"):
            parts.append(f"anchor + LoRA trained {c['finetune']['steps']} steps (the bridge ran {b.get('steps_run')}), "
                         f"final training loss {c['finetune']['loss_last'][-1]:.3f}"
                         + (f" ({c['finetune']['reused_from']})" if c["finetune"].get("reused_from") else ""))
        if c.get("untrained"):
            u = c["untrained"]
            parts.append(f"the untrained-m_A bridge kept step {u['best_step']} of {u['steps_run']} (development "
                         "checks: " + ", ".join(f"{x['step']}: {x['dev_exact']:.0f}%" for x in u["checks"]) + ")")
        lines += ["", "Controls: " + "; ".join(parts) + "."]
    g = with_expected(g)
    changed = "; ".join(f"{k} {', '.join(repr(q) for q in g[key])}" for k, key in
                        (("lost", "expected_lost"), ("gained", "expected_gained")) if g[key])
    lines += ["", f"General prompts ({g['prompts']}): perplexity of written answers {g['perplexity_on']:.2f} with the "
              f"bridge on, {g['perplexity_off']:.2f} off (ratio {g['ratio']:.3f}); {g['identical_answers']} of "
              f"{g['prompts']} greedy answers identical; {g['expected_on']} hold an expected word (general.EXPECTED: "
              f"'Paris', 'seven'...) with the bridge on, {g['expected_off']} off" + (f" ({changed})" if changed else "")
              + f"; answers cut at {(result.get('settings') or {}).get('general_new_tokens', 24)} tokens.", "",
              "Times (s, wall, 2 CPU cores): " + ", ".join(f"{k} {v:.0f}" for k, v in t.items()),
              "", "Columns: " + "; ".join(f"**{k}**: {v}" for k, v in COLUMN_NOTES.items() if k in cols), "",
              "Protocol: " + protocol(result.get("settings"), result.get("development")), "", "Departures from the paper: " + " ".join(departures(result.get("settings") or {}))]
    return "\n".join(lines) + "\n"


def write(out: Path, result: dict, settings=None) -> None:
    out = Path(out)
    if ROW_PERPLEXITY in result["table"]:  # a finished run: its general rows (older runs get the answer check)
        result = dict(result, general=with_expected(result["general"]))
        result["table"].update(general_rows(result["general"]))
    data = {"table": result["table"], "times_s": result["times_s"], "general": result["general"],
            "protocol": protocol(result.get("settings"), result.get("development")),
            "column_notes": COLUMN_NOTES, "departures": departures(result.get("settings") or {}),
            "answer_formats": {"question": "chat template, user turn = the question",
                               "answer": ("the sentence 'NAME was born in TOWN.'" if (result.get("settings") or {}).get(
                                   "answer_style") == "sentence" else "a space, the town") + ", then <|im_end|>"},
            "counts": result.get("counts"), "settings": result.get("settings"),
            "augment": result.get("augment"), "bridge": result.get("bridge"), "controls": result.get("controls"),
            "by_form": result.get("by_form")}
    if result.get("development"):
        data["development"] = result["development"]
    (out / "table.json").write_text(json.dumps(data, indent=1))
    (out / "table.md").write_text(markdown(result))


if __name__ == "__main__":  # python -m demos.real_knowledge.report RUN_DIR: relabel without recomputing
    import sys

    relabel(Path(sys.argv[1]))
