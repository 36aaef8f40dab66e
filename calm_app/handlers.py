"""The app's event handlers, tab by tab: each reads widget values, calls the session (calm_core)
and returns what the widgets show (views.py). Bounds and memory checks live in calm_core."""
from __future__ import annotations

import tempfile
from dataclasses import replace

import gradio as gr

from calm_core import CALMConfig, CALMError, bounds, figures
from calm_core.lab.model_cache import default_dtype
from calm_core.lab.presets import prepare_real_pair
from calm_core.lab.resources import LEDGER, data_bytes
from calm_core.lab.session import LabSession
from calm_core.models.loading import describe
from calm_core.training.data import preview

from . import views
from .views import friendly, require

SCORING_NOTES = {
    "substitution": "Scored as the preset's table was: on the text before the answer's first `=` (the values).\n\n",
    "result": "Scored as the preset's table was: on the text after the answer's last `=` (the result).\n\n",
}


# ---- Models --------------------------------------------------------------------------------

def _fresh_views(session: LabSession, bridge_message: str = "") -> tuple:
    """After the models or bridge changed: the Chat tab's settings and cleared chats, and no stale
    download link, training status or bridge message."""
    return (views.chat_settings(session) + views.train_settings(session) + (None, "", bridge_message)
            + (views.attention_reading(session), views.baseline_menu(session), views.baseline_column(session, None))
            + views.advanced_settings(session))


@friendly
def start(preset_name):
    session = LabSession()
    if preset_name:
        session.use_preset(preset_name)
    return _everything(session)


@friendly
def use_preset(session, preset_name, progress=gr.Progress()):
    session = session or LabSession()  # API clients skip the page's load event
    if not preset_name:
        raise CALMError("Pick a preset first.")
    session.use_preset(preset_name, progress=lambda fraction, message: progress(fraction, desc=message))
    return _everything(session)


def _everything(session):
    """The outputs of loading a preset, in layout.wire's order: the models' first seven (as before the
    head menu and story existed), data, evaluation menus, the models' rest, evaluation tokens, fresh views."""
    models = views.model_outputs(session)
    return (models[:7] + views.data_outputs(session) + views.eval_choices(session)[:4] + models[7:]
            + views.eval_choices(session)[4:] + _fresh_views(session))


def _parse_layers(text: str) -> list[int]:
    try:
        return [int(x) for x in (text or "").replace(" ", "").split(",") if x]
    except ValueError:
        raise CALMError("Layers are comma-separated integers, e.g. 1,3.") from None


def _layers_within(values: list[int], label: str, depth: int) -> list[int] | None:
    for value in values:
        bounds.whole(label, value, -depth, depth - 1, f" (the model has {depth} layers)")
    return values or None


@friendly
def build(session, anchor, augments, every, anchor_layers, augment_layers, heads, gate, insert="after", recency=0,
          null_slot=False, window=0):
    session = session or LabSession()
    names = (augments or "").replace(",", "\n").splitlines()
    anchor_layers, augment_layers = _parse_layers(anchor_layers), _parse_layers(augment_layers)
    if not (anchor or "").strip() or not any(n.strip() for n in names):
        raise CALMError("Choose an anchor model and at least one augmenting model.")
    anchor_pair = session.cache.get(anchor.strip(), default_dtype())
    augment_pairs = [session.cache.get(n.strip(), default_dtype()) for n in names if n.strip()]
    a_info, b_info = describe(anchor_pair[0]), [describe(p[0]) for p in augment_pairs]
    shallowest = min(i.num_layers for i in b_info)
    config = CALMConfig(
        every=bounds.whole("every k-th augmenting layer", every, 1, shallowest, " (the augmenting model's depth)"),
        anchor_layers=_layers_within(anchor_layers, "an anchor layer", a_info.num_layers),
        augment_layers=_layers_within(augment_layers, "an augmenting layer", shallowest),
        num_heads=bounds.whole("heads", heads or 0, 0, a_info.width, " (0 = the anchor's own)") or None,
        gate=gate, insert=insert or "after", recency=bounds.whole("recency biases", recency or 0, 0, bounds.MAX_RECENCY),
        null_slot=bool(null_slot), window=bounds.whole("window", window or 0, 0, 1 << 20))
    session.build(anchor, names, config)
    return views.model_outputs(session) + _fresh_views(session)


@friendly
def reset_bridge(session):
    session = require(session)
    config, note = session.require().config, ""
    if config.gate == "none":  # a bridge without a gate cannot start closed: give the new one gates
        config, note = replace(config, gate="channel"), " This bridge had no gate; the new one has channel gates."
    session.reset_bridge(config)
    return (("Started over: a new bridge with closed gates, so the composition is the anchor exactly." + note,)
            + views.model_outputs(session) + _fresh_views(session))


@friendly
def load_real_pair(session, progress=gr.Progress()):
    """Gemma 3 270M (anchor) + SmolLM2-135M-Instruct (augmenting), prepared first where this server has
    not yet, each loaded (after its memory check) with progress, then composed through a new, closed bridge."""
    session = session or LabSession()
    folders = prepare_real_pair(progress=lambda fraction, message: progress(fraction, desc=message))
    for fraction, (key, title) in zip((0.05, 0.5), (("gemma", "Gemma 3 270M"), ("smollm2", "SmolLM2-135M-Instruct"))):
        progress(fraction, desc=f"loading {title}")
        session.cache.get(str(folders[key]), default_dtype())  # cached: build() below finds it
    progress(0.9, desc="composing")
    session.build(str(folders["gemma"]), [str(folders["smollm2"])], CALMConfig(every=6))
    return (("Composed Gemma 3 270M (anchor) with SmolLM2-135M-Instruct (augmenting) through a new bridge with closed "
             "gates: it answers as Gemma alone until you train it. Gemma 3 270M is a base model: use **completion**.",)
            + views.model_outputs(session) + _fresh_views(session))


# ---- Data & train --------------------------------------------------------------------------

@friendly
def inspect_upload(session, file):
    if file is None:
        return gr.update(value=None), "No file.", gr.update(), gr.update(), gr.update()
    with LEDGER.reserve(data_bytes(file), "Reading this file", "Upload a smaller file."):
        rows = preview(file, n=8, check_roles=False)  # the mapping is chosen below, then checked by use_data
    columns = list(rows[0]) if rows else []
    guess = lambda *names: next((c for c in columns if c in names), "(none)")
    return (gr.update(value=[[r.get(c) for c in columns] for r in rows], headers=columns),
            "Check the columns below, then press **Use this data**.",
            *[gr.update(choices=["(none)"] + columns, value=guess(*names)) for names in
              (("prompt", "source", "question", "input"), ("completion", "target", "answer", "output"), ("text",))])


@friendly
def use_data(session, file, preset_file, prompt_col, completion_col, text_col, validation_fraction):
    session = require(session)
    column_map = {c: role for c, role in ((prompt_col, "prompt"), (completion_col, "completion"), (text_col, "text"))
                  if c and c != "(none)"}
    fraction = bounds.real("validation share", validation_fraction, 0, 0.5)
    if file is not None:
        splits = session.set_data(file, column_map or None, validation_fraction=fraction)
    elif preset_file and session.preset and preset_file in session.preset.data_files:
        splits = session.set_data(session.preset.data_files[preset_file], validation_fraction=fraction)
    else:
        raise CALMError("Upload a file or pick one of the preset's data sets.")
    return (f"Using **{splits.source}**: {len(splits.train):,} training, {len(splits.validation):,} validation examples "
            f"({splits.shape}).{views.kept_note(splits)}")


@friendly
def train(session, steps, lr, batch_size, gate_lr_scale=1.0, augment_noise=0.0, method="calm", recipe=None,
          position_lr_scale=None, value_lr_scale=None, bf16=None, run_name=""):
    session = require(session)
    config = session.train_config(**bounds.train_fields(
        steps, lr, batch_size, gate_lr_scale, augment_noise, method or "calm", recipe=recipe,
        position_lr_scale=position_lr_scale, value_lr_scale=value_lr_scale, bf16=bf16))
    run = session.start_training(config, name=str(run_name or "").strip()[:80])
    labels = session.require().layer_pairs() if config.method == "calm" else []  # a baseline has no gates
    try:
        for status, loss, gates, accuracy in views.follow_run(session, run, labels):
            yield status, loss, gates, None, accuracy
    except GeneratorExit:  # the page went away: stop, keeping what was learned
        session.stop_training()
        raise
    if config.method != "calm" and config.method in session.baselines:
        run.message += " " + views.baseline_note(session, config.method)
        yield views.train_view(run, labels) + (None, views.accuracy_view(run))


@friendly
def choose_recipe(session, recipe):
    """A recipe picked in the Train tab: its scales fill the fields (the rest stay the preset's)."""
    session = require(session)
    session.set_recipe(recipe)
    return views.train_settings(session) + views.advanced_settings(session)


@friendly
def stop(session):
    if session is None or not session.stop_training():
        return "Nothing is training."
    return "Stopping after this step; the bridge keeps what it learned."


@friendly
def download_bridge(session):
    return str(require(session).export_bridge(tempfile.mkdtemp(prefix="calm-export-")))


@friendly
def upload_bridge(session, files):
    session = require(session)
    warning = session.import_bridge(files if isinstance(files, list) else [files])
    return views.model_outputs(session) + _fresh_views(session, warning or "Bridge loaded.")


# ---- Chat ----------------------------------------------------------------------------------

@friendly
def chat(session, message, h_calm, h_anchor, h_augment, max_new_tokens, do_sample, temperature, top_k, top_p, seed,
         gate_scale, layers_off, mode, baseline=views.NO_BASELINE, h_baseline=None):
    session = require(session)
    calm = session.require()
    try:
        yield from _chat(session, calm, message, h_calm, h_anchor, h_augment, max_new_tokens, do_sample, temperature,
                         top_k, top_p, seed, gate_scale, layers_off, mode, baseline, h_baseline)
    except CALMError as exc:  # a refused prompt or field: said beside the chats, which stay as they were
        gr.Warning(str(exc))
        chats = [list(h or []) for h in (h_calm, h_anchor, h_augment)]
        yield (*chats, f"**Not sent:** {exc}", gr.skip())


def _chat(session, calm, message, h_calm, h_anchor, h_augment, max_new_tokens, do_sample, temperature, top_k, top_p,
          seed, gate_scale, layers_off, mode, baseline, h_baseline):
    if not message or not message.strip():
        raise CALMError("Type a prompt first.")
    sampling = dict(do_sample=bool(do_sample), temperature=bounds.real("temperature", temperature, 0, 10, low_open=True),
                    top_k=bounds.whole("top-k", top_k or 0, 0, calm.anchor.info.vocab_size) or None,
                    top_p=None, seed=bounds.whole("seed", seed or 0, 0, 2**32 - 1) if do_sample else None)
    top_p = bounds.real("top-p", top_p, 0, 1, low_open=True)
    sampling["top_p"] = top_p if top_p < 1 else None
    scale = bounds.real("gate scale", gate_scale, 0, 3)
    layers = [int(label.split(":")[0]) for label in layers_off or []]
    baseline = None if not baseline or baseline == views.NO_BASELINE else baseline
    histories = [list(h or []) + [{"role": "user", "content": message}]
                 for h in (h_calm, h_anchor, h_augment, h_baseline if baseline else [])]
    prompt = message if mode == "completion" else [{"role": m["role"], "content": m["content"]} for m in histories[0]]
    note = "" if mode == "completion" or session.has_chat_template() else (
        "*These models have no chat template: chat mode writes `user: …` / `assistant:` lines they never saw, so "
        "expect nonsense; use **completion**.* ")
    texts = ("",) * (4 if baseline else 3)
    for texts in session.replies(prompt, max_new_tokens, scale, layers, baseline, **sampling):
        yield _chat_outputs(histories, texts, note, baseline)
    speed = f"{getattr(session, 'last_tokens_per_s', 0):.0f} tokens/s over the {len(texts)} models."
    # a model that ends at once (EOS first) would otherwise leave an empty bubble
    yield _chat_outputs(histories, [t or "*(ended at once: no text)*" for t in texts], note + speed, baseline)


def _chat_outputs(histories, texts, note, baseline):
    """Each column's history with its answer so far; the baseline column unchanged while none is picked."""
    chats = [h + [{"role": "assistant", "content": t}] for h, t in zip(histories, texts)]
    return (*chats[:3], note, chats[3] if baseline else gr.skip())


# ---- Inside the bridge ---------------------------------------------------------------------

@friendly
def show_gates(session):
    return views.gate_figures(require(session))


@friendly
def show_attention(session, text, layer, head, read_as="text"):
    session = require(session)
    calm = session.require()
    layer = bounds.whole("composition layer", layer or 0, 0, len(calm.layer_pairs()) - 1)
    head = None if head in (None, "mean") else bounds.whole("head", head, 0, bounds.heads(calm) - 1,
                                                            f" (this bridge has {bounds.heads(calm)} heads)")
    record = session.attention(text, as_chat=read_as == views.CHAT_QUESTION)
    return figures.attention_map(record, layer, head, null_slot=calm.config.null_slot)


# ---- Evaluate ------------------------------------------------------------------------------

@friendly
def run_eval(session, choice, upload, metrics, max_new_tokens, limit, progress=gr.Progress()):
    session = require(session)
    preset = session.preset
    path = upload or (preset.eval_files.get(choice) if preset and choice else None)
    if path is None:
        raise CALMError("Pick an evaluation set or upload one.")
    scoring = preset.scoring(choice) if preset and not upload else "exact"
    table = session.evaluate(path, metrics or ["exact_match"], max_new_tokens, limit,
                             progress=lambda i, n: progress((i, n), desc="generating answers"), scoring=scoring)
    note = SCORING_NOTES.get(scoring, "")
    if preset and not upload:
        cells = preset.table_cells(choice)
        if cells:
            note += "The preset's table on this set (all its examples): " + "; ".join(
                f"{metric} CALM {values.get('CALM', '–')}" for metric, values in cells.items()) + ".\n\n"
    return views.eval_outputs(table, note)
