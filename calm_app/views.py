"""What the widgets show for a session's state: pure functions from a LabSession to component
values and updates, shared by the handlers that change that state."""
from __future__ import annotations

import functools
import inspect
import time
import traceback

import gradio as gr

from calm_core import CALMError, figures
from calm_core.lab import run_figures
from calm_core.lab.bounds import heads
from calm_core.lab.comparison import FORGETTING_COLUMNS
from calm_core.lab.session import NATIVE_BF16, LabSession, layer_labels, model_rows, short_name
from calm_core.training.evaluation import METRICS
from calm_core.training.recipes import RECIPES, get_recipe, is_new

ROLES_NOTE = ("**Who is who.** The *anchor* is the model that answers; the *augmenting* model only lends it its hidden "
              "states. In the paper's tables m_A is the augmenting model and m_B the anchor (the paper names them by "
              "what they know: m_A holds the new knowledge, m_B the skill; our names say what each does in the "
              "composition). **Null slot**: a place "
              "the cross-attention may look at to write nothing. **Window**: how many of the newest augmenting states "
              "each anchor token may look at (0 = all it may see).")


def friendly(fn):
    """Show calm_core errors as a message in the page, never a traceback; the server log gets one
    traceback for an unexpected error and none for a handled one."""
    def explain(exc):
        if isinstance(exc, gr.Error):
            return exc
        if isinstance(exc, CALMError):
            return gr.Error(str(exc), print_exception=False)
        traceback.print_exception(exc)
        return gr.Error(f"Something went wrong: {type(exc).__name__}: {exc}", print_exception=False)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except GeneratorExit:
                raise
            except Exception as exc:
                raise explain(exc) from None
        return gen

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise explain(exc) from None
    return call


def require(session) -> LabSession:
    if session is None:
        raise CALMError("No models in this session yet: load a preset or compose two models first.")
    return session


# ---- Models tab ------------------------------------------------------------------------------

def bridge_summary(calm) -> str:
    labels = layer_labels(calm)
    trainable, total = calm.num_parameters()
    config = calm.config
    layers = f"{len(labels)} composition layer" + ("" if len(labels) == 1 else "s")
    gate = ("**no gate**: the bridge adds its output in full, so it does not start as the anchor, and the gate "
            "plots read 1.0" if config.gate == "none" else f"gate type `{config.gate}`, starting closed")
    return (f"**Bridge:** {trainable:,} trainable parameters — {100 * trainable / total:.2f}% of all {total:,}; "
            f"{layers}, {gate}, added {config.insert} each anchor layer"
            + (f", {config.recency} recency biases per head" if config.recency else "")
            + (", a null slot" if config.null_slot else "")
            + (f", a window of {config.window} augmenting states" if config.window else "") + ".")


def model_outputs(session: LabSession):
    """session, models table, summary, diagram, layers-off menu, layer menu, examples, head menu, story."""
    if session.calm is None:  # no preset shipped: start empty, ready for the user's models
        return (session, [], "No models yet: choose two below.", None, gr.update(choices=[], value=[]),
                gr.update(choices=[0], value=0), gr.Dataset(samples=[["Hello"]]),
                gr.update(choices=["mean"], value="mean"), ROLES_NOTE)
    calm = session.require()
    labels = layer_labels(calm)
    diagram = figures.layer_diagram(calm.anchor.info.num_layers, [m.info.num_layers for m in calm.augments],
                                    calm.layer_pairs(), "anchor", [f"augment {k}" for k in range(len(calm.augments))],
                                    insert=calm.config.insert)
    preset = session.preset
    examples = [[p] for p in (preset.example_prompts if preset else [])]
    story = (preset.story_markdown() + "\n\n" if preset else "") + ROLES_NOTE
    return (session, model_rows(calm), bridge_summary(calm), diagram, gr.update(choices=labels, value=[]),
            gr.update(choices=list(range(len(labels))), value=0), gr.Dataset(samples=examples or [["Hello"]]),
            gr.update(choices=["mean"] + list(range(heads(calm))), value="mean"), story)


def real_pair_note() -> str:
    from calm_core.models.real_pair import PREPARE_COMMAND, prepared_pair, prepares_at_first_use

    if prepared_pair() is not None:
        return "*The real pair is prepared on this server: about 1.6 GB in float32 (half in bf16 on a GPU).*"
    if prepares_at_first_use():
        return ("*The real pair is prepared at first use (its preset or the real-pair button): about 2 min once "
                "on 2 CPU cores, then about 1.6 GB in float32.*")
    return f"*The real pair is not prepared on this server; prepare it once with `{PREPARE_COMMAND}`.*"


# ---- Data & train tab --------------------------------------------------------------------------

def data_outputs(session: LabSession):
    """preview, note, three column menus; for the session's data (none: cleared)."""
    from calm_core.training.data import preview

    splits = session.splits
    if splits is None:
        return gr.update(value=None), "No data yet.", gr.update(), gr.update(), gr.update()
    path = session.preset.train_file if session.preset else None
    rows = preview(path) if path else []
    columns = splits.columns
    note = (f"**{splits.source}** — {len(splits.train):,} training and {len(splits.validation):,} validation examples "
            f"({splits.shape}).{kept_note(splits)}")
    return (gr.update(value=[[r.get(c) for c in columns] for r in rows], headers=columns), note,
            *[gr.update(choices=["(none)"] + columns, value=default if default in columns else "(none)")
              for default in ("prompt", "completion", "text")])


def kept_note(splits) -> str:
    """What the keep_anchor column does to this data, when it has rows marked true."""
    kept = splits.kept
    return (f" {kept:,} training rows have **keep_anchor** true: their completions are trained toward the anchor "
            "alone's own next-token distribution (rehearsal: the bridge learns to leave the anchor as it was there), "
            "not toward their text." if kept else "")


TRAIN_METHODS = [("the bridge (CALM)", "calm"), ("baseline: LoRA on the anchor", "lora"),
                 ("baseline: the anchor's top layers", "finetune")]


def baseline_note(session: LabSession, method: str) -> str:
    """What a finished baseline is, with both parameter counts: the comparison is like for like."""
    name, _ = next(c for c in session.baseline_columns() if c[1] is session.baselines[method])
    return (f"The baseline is ready: {name}. Evaluate scores it on the same rows beside the composition; "
            f"the composition's bridge is unchanged.")


def train_view(run, labels):
    return run.status(), figures.loss_curves(run.history), figures.gate_history(run.history, labels)


def accuracy_view(run):
    return run_figures.accuracy_curve(run.accuracy)


STATUS_EVERY_S, PLOTS_EVERY_S = 0.7, 3.0  # the status line often; the three plots less often (drawing them costs the
#                                           server and the page CPU time a training run on the same cores wants)


def follow_run(session, run, labels):
    """(status, loss plot, gate plot, accuracy plot) while a run trains, then once more when it ended. Between
    redraws the plots are left as they are (gr.skip()), so a long run is not slowed by drawing its own curves."""
    drawn_at, drawn_steps = 0.0, -1
    while session.training or run.running:
        session.wait(STATUS_EVERY_S)
        if time.perf_counter() - drawn_at >= PLOTS_EVERY_S and len(run.history) != drawn_steps:
            drawn_at, drawn_steps = time.perf_counter(), len(run.history)
            yield train_view(run, labels) + (accuracy_view(run),)
        else:
            yield (run.status(), gr.skip(), gr.skip(), gr.skip())
    yield train_view(run, labels) + (accuracy_view(run),)


# ---- Chat tab ----------------------------------------------------------------------------------

def chat_settings(session: LabSession):
    """Max new tokens and prompt mode from the preset (or the defaults), and cleared chats."""
    preset = session.preset
    tokens = preset.max_new_tokens if preset else 32
    mode = preset.prompt_mode if preset else "completion"  # chat is for instruction-tuned anchors: the user's call
    return gr.update(value=tokens), gr.update(value=mode), [], [], [], ""


NO_BASELINE = "none"


def baseline_menu(session: LabSession | None, value: str | None = None):
    """The Chat tab's fourth-column menu: each baseline trained in this session, by its name in Evaluate."""
    names = [(name, method) for method in (session.baselines if session else {})
             for name, b in session.baseline_columns() if b is session.baselines[method]]
    value = value if value in [m for _, m in names] else NO_BASELINE
    return gr.update(choices=[("none: train a baseline in the Train tab", NO_BASELINE)] + names, value=value)


def baseline_column(session: LabSession | None, method: str | None):
    """The fourth chat column: shown, empty and named after its baseline while one is picked."""
    if not session or not method or method == NO_BASELINE or method not in session.baselines:
        return gr.update(visible=False, value=[])
    name = next(n for n, b in session.baseline_columns() if b is session.baselines[method])
    return gr.update(visible=True, value=[], label=name.split(" (")[0])  # the counts: in the menu


# ---- Inside the bridge tab -----------------------------------------------------------------------

ATTENTION_READINGS = ("text", "chat question")
CHAT_QUESTION = ATTENTION_READINGS[1]


def attention_reading(session: LabSession):
    """The attention map reads the text as the preset's prompts were written: a chat preset's as a chat question."""
    preset = session.preset
    return gr.update(value=CHAT_QUESTION if preset and preset.prompt_mode == "chat" else ATTENTION_READINGS[0])


RECIPE_CHOICES = [(f"{r.name}: {r.summary}", r.name) for r in RECIPES.values()]
TRAIN_FIELDS = {"steps": 200, "lr": 1e-3, "batch_size": 16, "gate_lr_scale": 1.0, "augment_noise": 0.0}  # the layout's


def train_settings(session: LabSession):
    """The Train fields as pressing Train would run them (LabSession.train_config: the recipe, the preset's
    recorded settings), and a note saying where they come from."""
    config, preset = session.train_config(), session.preset
    values = [gr.update(value=getattr(config, k)) for k in TRAIN_FIELDS]
    recipe = get_recipe(config.recipe)
    parts = [f"*Recipe **{recipe.name}**: {recipe.summary}"]
    if preset and preset.train:
        parts.append(f"The fields hold the settings the bridge of the preset `{preset.name}` was trained with.")
    scales = [f"{name} at {getattr(config, key):g}× the learning rate" for key, name in (
        ("position_lr_scale", "recency biases and null keys"), ("value_lr_scale", "the value path"))
        if getattr(config, key) != 1]
    if preset and preset.train.get("bf16") == NATIVE_BF16:
        scales.append("bf16 " + ("on: this processor computes it natively (faster, same accuracy on the preset)"
                                 if config.bf16 else "off: this processor has no native bf16, float32 is faster here"))
    if scales:
        parts.append("Under “All settings”: " + "; ".join(scales) + ".")
    if session.loaded_settings:
        shown = ", ".join(f"{k} {v}" for k, v in session.loaded_settings.items())
        parts.append(f"From the loaded settings file: {shown}.")
    new = session.calm is not None and is_new(session.calm)
    parts.append("The recipe starts this new bridge at the first Train.*" if new else
                 "Training goes on from the bridge as it is now (Start over in the Models tab for a new one).*")
    return (*values, " ".join(parts))


def advanced_settings(session: LabSession):
    """The folded Train fields: recipe, position and value learning-rate scales, bf16."""
    config = session.train_config()
    return (gr.update(value=config.recipe), gr.update(value=config.position_lr_scale),
            gr.update(value=config.value_lr_scale), gr.update(value=config.bf16))


# ---- Inside the bridge tab ---------------------------------------------------------------------

def gate_figures(session: LabSession):
    calm = session.require()
    gates, pairs = calm.gates(), calm.layer_pairs()
    history = (figures.gate_history(session.run.history, pairs) if session.run.history else
               figures.empty("No training in this session yet (a preset's bridge was trained by its demo script)"))
    return figures.gate_bars(gates, pairs, calm.config.gate), figures.gate_heatmap(gates, pairs, calm.config.gate), history


# ---- Evaluate tab ------------------------------------------------------------------------------

def eval_choices(session: LabSession):
    """set menu, paper table, preset data menu, metrics, max new tokens."""
    preset = session.preset
    choices = list(preset.eval_files) if preset else []
    paper = preset.comparison_markdown() if preset else ""
    data = list(preset.data_files) if preset else []
    metrics = [m for m in preset.metrics if m in METRICS] if preset else ["exact_match", "loss"]
    tokens = (preset.eval_max_new_tokens or preset.max_new_tokens) if preset else 16
    return (gr.update(choices=choices, value=choices[0] if choices else None), paper, gr.update(choices=data, value=None),
            gr.update(value=metrics), gr.update(value=tokens))


def eval_outputs(table, note: str):
    columns = ["model"] + [m for m in list(METRICS) + ["perplexity", *FORGETTING_COLUMNS] if any(m in r for r in table.rows)]
    for r in table.rows:  # "anchor: /srv/.../presets/x/anchor" -> "anchor: presets/x/anchor"
        role, _, name = r["model"].partition(": ")
        r["model"] = f"{role}: {short_name(name)}" if name else role
    rows = [[r["model"]] + [round(r[c], 3) if isinstance(r.get(c), float) else r.get(c) for c in columns[1:]]
            for r in table.rows]
    signatures = "\n".join(f"- {k}: {_signature(v)}" for k, v in table.signatures.items())
    if FORGETTING_COLUMNS[1] in columns and str(table.rows[0].get(FORGETTING_COLUMNS[1], "")).startswith("0/"):
        note += ("The anchor alone answers none of the forgetting set's general questions (it never learned such "
                 "text), so that set cannot show what training took away here: the rows it does answer are the "
                 "check.\n\n")
    return (gr.update(value=rows, headers=columns), figures.eval_bars(table.rows, columns[1:]),
            note + signatures)


def _signature(text: str) -> str:
    """sacrebleu's signature ("nrefs:1|case:mixed|...") as words, with the raw one for reproduction."""
    parts = dict(p.split(":", 1) for p in text.split("|") if ":" in p)
    words = ", ".join(f"{k} {v}" for k, v in parts.items() if k in ("nrefs", "case", "tok", "nc", "nw", "version"))
    return f"{words} (`{text}`)"
