"""CALM Lab: compose two language models in the browser. This file only wires widgets to
calm_core; every computation and figure lives there."""
from __future__ import annotations

import functools
import inspect
import os
import tempfile

import gradio as gr

from calm_core import CALMConfig, CALMError, figures
from calm_core.config import GATE_TYPES, INSERT_POINTS
from calm_core.data import preview
from calm_core.evaluation import METRICS
from calm_core.lab import LabSession, layer_labels, model_rows
from calm_core.presets import list_presets
from calm_core.training import TrainConfig

try:  # on a Hugging Face ZeroGPU Space, long work runs on a GPU; elsewhere a no-op
    import spaces

    gpu = spaces.GPU
except ImportError:
    def gpu(fn):
        return fn

MAX_UPLOAD = "200mb"
DEFAULT_PRESET = os.environ.get("CALM_DEFAULT_PRESET", "kv_arithmetic")
MODEL_HEADERS = ["role", "name", "architecture", "layers", "width", "heads", "parameters"]

INTRO = """# CALM Lab
Two frozen language models — an **anchor** and an **augmenting** model — joined by a small trained
**bridge**: at a few layers the anchor cross-attends to the augmenting model's hidden states and adds
the result through a **gate** that starts closed, so the composition starts out exactly as the anchor
(*LLM Augmented LLMs*, ICLR 2024). Work through the tabs from left to right."""


def friendly(fn):
    """Show calm_core errors (and anything unexpected) as a message in the page, never a traceback."""
    def explain(exc):
        if isinstance(exc, gr.Error):
            return exc
        if isinstance(exc, CALMError):
            return gr.Error(str(exc))
        return gr.Error(f"Something went wrong: {type(exc).__name__}: {exc}")

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as exc:
                raise explain(exc) from exc
        return gen

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise explain(exc) from exc
    return call


def _session(session) -> LabSession:
    if session is None:
        raise CALMError("No models in this session yet: load a preset or compose two models first.")
    return session


# ---- Models --------------------------------------------------------------------------------

def _model_outputs(session: LabSession):
    if session.calm is None:  # no preset shipped: start empty, ready for the user's models
        return (session, [], "No models yet: choose two below.", None, gr.update(choices=[], value=[]),
                gr.update(choices=[0], value=0), gr.Dataset(samples=[["Hello"]]))
    calm = session.require()
    labels = layer_labels(calm)
    trainable, total = calm.num_parameters()
    summary = (f"**Bridge:** {trainable:,} trainable parameters — {100 * trainable / total:.2f}% of all "
               f"{total:,}; {len(labels)} composition layers, gate type `{calm.config.gate}`, "
               f"added {calm.config.insert} each anchor layer"
               + (f", {calm.config.recency} recency biases per head" if calm.config.recency else "")
               + (", a null slot" if calm.config.null_slot else "")
               + (f", a window of {calm.config.window} augmenting states" if calm.config.window else "") + ".")
    diagram = figures.layer_diagram(calm.anchor.info.num_layers, [m.info.num_layers for m in calm.augments],
                                    calm.layer_pairs(), calm.anchor.info.name, [m.info.name for m in calm.augments],
                                    insert=calm.config.insert)
    preset = session.preset
    examples = [[p] for p in (preset.example_prompts if preset else [])]
    return (session, model_rows(calm), summary, diagram, gr.update(choices=labels, value=[]),
            gr.update(choices=list(range(len(labels))), value=0), gr.Dataset(samples=examples or [["Hello"]]))


@friendly
def start(preset_name):
    session = LabSession()
    if preset_name:
        session.use_preset(preset_name)
    return _model_outputs(session) + _data_outputs(session) + _eval_choices(session)


@friendly
def use_preset(session, preset_name):
    session = session or LabSession()  # API clients skip the page's load event
    session.use_preset(preset_name)
    return _model_outputs(session) + _data_outputs(session) + _eval_choices(session)


@friendly
def build(session, anchor, augments, every, anchor_layers, augment_layers, heads, gate, insert="after", recency=0,
          null_slot=False, window=0):
    session = session or LabSession()
    parse = lambda text: [int(x) for x in text.replace(" ", "").split(",") if x] or None
    try:
        config = CALMConfig(every=int(every), anchor_layers=parse(anchor_layers), augment_layers=parse(augment_layers),
                            num_heads=int(heads) or None, gate=gate, insert=insert or "after",
                            recency=int(recency or 0), null_slot=bool(null_slot),
                            window=int(window or 0))
    except ValueError:
        raise CALMError("Layers are comma-separated integers, e.g. 1,3.") from None
    session.build(anchor, augments.replace(",", "\n").splitlines(), config)
    session.preset = None
    return _model_outputs(session)


# ---- Data & train --------------------------------------------------------------------------

def _data_outputs(session: LabSession):
    splits = session.splits
    if splits is None:
        return gr.update(value=None), "No data yet.", gr.update(), gr.update(), gr.update()
    path = session.preset.train_file if session.preset else None
    rows = preview(path) if path else []
    columns = splits.columns
    note = f"**{splits.source}** — {len(splits.train)} training and {len(splits.validation)} validation examples ({splits.shape})."
    return (gr.update(value=[[r.get(c) for c in columns] for r in rows], headers=columns), note,
            *[gr.update(choices=["(none)"] + columns, value=default if default in columns else "(none)")
              for default in ("prompt", "completion", "text")])


@friendly
def inspect_upload(session, file):
    if file is None:
        return gr.update(value=None), "No file.", gr.update(), gr.update(), gr.update()
    rows = preview(file, n=8, check_roles=False)  # the mapping is chosen below, then checked by use_data
    columns = list(rows[0]) if rows else []
    guess = lambda *names: next((c for c in columns if c in names), "(none)")
    return (gr.update(value=[[r.get(c) for c in columns] for r in rows], headers=columns),
            "Check the columns below, then press **Use this data**.",
            *[gr.update(choices=["(none)"] + columns, value=guess(*names)) for names in
              (("prompt", "source", "question", "input"), ("completion", "target", "answer", "output"), ("text",))])


@friendly
def use_data(session, file, preset_file, prompt_col, completion_col, text_col, validation_fraction):
    session = _session(session)
    column_map = {c: role for c, role in ((prompt_col, "prompt"), (completion_col, "completion"), (text_col, "text"))
                  if c and c != "(none)"}
    if file is not None:
        splits = session.set_data(file, column_map or None, validation_fraction=validation_fraction)
    elif preset_file and session.preset:
        splits = session.set_data(session.preset.data_files[preset_file], validation_fraction=validation_fraction)
    else:
        raise CALMError("Upload a file or pick one of the preset's data sets.")
    return f"Using **{splits.source}**: {len(splits.train)} training, {len(splits.validation)} validation examples ({splits.shape})."


@gpu
@friendly
def train(session, steps, lr, batch_size, gate_lr_scale=1.0, augment_noise=0.0, progress=gr.Progress()):
    session = _session(session)
    config = TrainConfig(steps=int(steps), lr=float(lr), batch_size=int(batch_size), gate_lr_scale=float(gate_lr_scale or 1.0),
                         augment_noise=float(augment_noise or 0.0),
                         log_every=max(1, int(steps) // 40),
                         eval_every=max(1, int(steps) // 10), warmup_steps=max(1, int(steps) // 10), progress=False)
    run = session.start_training(config)
    labels = session.require().layer_pairs()
    try:
        while session.training or run.running:
            session.wait(0.7)
            progress((run.step, run.total), desc="training the bridge")
            yield _train_view(run, labels)
    except GeneratorExit:  # the page went away: stop, keeping what was learned
        session.stop_training()
        raise
    yield _train_view(run, labels)


def _train_view(run, labels):
    return run.status(), figures.loss_curves(run.history), figures.gate_history(run.history, labels)


@friendly
def stop(session):
    _session(session).stop_training()
    return "Stopping after this step; the bridge keeps what it learned."


@friendly
def download_bridge(session):
    return str(_session(session).export_bridge(tempfile.mkdtemp(prefix="calm-export-")))


@friendly
def upload_bridge(session, files):
    session = _session(session)
    session.import_bridge(files if isinstance(files, list) else [files])
    return ("Bridge loaded.",) + _model_outputs(session)


# ---- Chat ----------------------------------------------------------------------------------

@gpu
@friendly
def chat(session, message, h_calm, h_anchor, h_augment, max_new_tokens, do_sample, temperature, top_k, top_p, seed,
         gate_scale, layers_off, mode):
    session = _session(session)
    if not message or not message.strip():
        raise CALMError("Type a prompt first.")
    histories = [list(h or []) + [{"role": "user", "content": message}] for h in (h_calm, h_anchor, h_augment)]
    prompt = message if mode == "completion" else [{"role": m["role"], "content": m["content"]} for m in histories[0]]
    sampling = dict(do_sample=bool(do_sample), temperature=float(temperature), top_k=int(top_k) or None,
                    top_p=float(top_p) if float(top_p) < 1 else None, seed=int(seed) if do_sample else None)
    layers = [int(label.split(":")[0]) for label in layers_off or []]
    texts = ("", "", "")
    for texts in session.replies(prompt, int(max_new_tokens), float(gate_scale), layers, **sampling):
        yield tuple(h + [{"role": "assistant", "content": t}] for h, t in zip(histories, texts))
    # a model that ends at once (EOS first) would otherwise leave an empty bubble
    yield tuple(h + [{"role": "assistant", "content": t or "*(ended at once: no text)*"}] for h, t in zip(histories, texts))


# ---- Inside the bridge ---------------------------------------------------------------------

@friendly
def show_gates(session):
    session = _session(session)
    calm = session.require()
    gates, pairs = calm.gates(), calm.layer_pairs()
    return figures.gate_bars(gates, pairs), figures.gate_heatmap(gates, pairs), figures.gate_history(session.run.history, pairs)


@friendly
def show_attention(session, text, layer, head):
    session = _session(session)
    record = session.attention(text)
    head = None if head in (None, "mean") else int(head)
    return figures.attention_map(record, int(layer or 0), head)


# ---- Evaluate ------------------------------------------------------------------------------

def _eval_choices(session: LabSession):
    preset = session.preset
    choices = list(preset.eval_files) if preset else []
    paper = preset.comparison_markdown() if preset else ""
    data = list(preset.data_files) if preset else []
    metrics = [m for m in preset.metrics if m in METRICS] if preset else ["exact_match", "loss"]
    return (gr.update(choices=choices, value=choices[0] if choices else None), paper, gr.update(choices=data, value=None),
            gr.update(value=metrics))


@gpu
@friendly
def run_eval(session, choice, upload, metrics, max_new_tokens, limit, progress=gr.Progress()):
    session = _session(session)
    path = upload or (session.preset.eval_files.get(choice) if session.preset and choice else None)
    if path is None:
        raise CALMError("Pick an evaluation set or upload one.")
    table = session.evaluate(path, metrics or ["exact_match"], int(max_new_tokens), int(limit) or None,
                             progress=lambda i, n: progress((i, n), desc="generating answers"))
    columns = ["model"] + [m for m in list(METRICS) + ["perplexity"] if any(m in r for r in table.rows)]
    rows = [[r["model"]] + [round(r[c], 3) if isinstance(r.get(c), float) else r.get(c) for c in columns[1:]] for r in table.rows]
    main_metric = next((m for m in ("exact_match", "chrf", "bleu", "loss") if m in columns), columns[-1])
    signatures = "\n".join(f"- {k}: `{v}`" for k, v in table.signatures.items())
    return gr.update(value=rows, headers=columns), figures.eval_bars(table.rows, main_metric), signatures


# ---- Layout --------------------------------------------------------------------------------

def build_app() -> gr.Blocks:
    presets = list_presets()
    default = DEFAULT_PRESET if DEFAULT_PRESET in presets else (presets[0] if presets else None)
    with gr.Blocks(title="CALM Lab") as demo:
        session = gr.State(delete_callback=lambda s: s and s.stop_training())
        gr.Markdown(INTRO)
        with gr.Tabs():
            with gr.Tab("1 · Models"):
                gr.Markdown("Pick a **preset** (a trained pair with its bridge), or any two causal language models by "
                            "local folder or Hugging Face id. The bridge connects every *k*-th augmenting layer to an anchor layer.")
                with gr.Row():
                    preset = gr.Dropdown(presets, value=default, label="Preset", scale=2)
                    preset_btn = gr.Button("Load preset", variant="primary", scale=1)
                with gr.Accordion("…or choose your own models", open=False):
                    with gr.Row():
                        anchor = gr.Textbox(label="Anchor model (folder or hub id)")
                        augments = gr.Textbox(label="Augmenting model(s), one per line")
                    with gr.Row():
                        every = gr.Number(4, label="every k-th augmenting layer", precision=0)
                        anchor_layers = gr.Textbox(label="explicit anchor layers (e.g. 1,3)")
                        augment_layers = gr.Textbox(label="explicit augmenting layers")
                        heads = gr.Number(0, label="heads (0 = anchor's)", precision=0)
                        gate = gr.Radio(list(GATE_TYPES), value="channel", label="gate")
                        insert = gr.Radio(list(INSERT_POINTS), value="after",
                                          label="bridge at each anchor layer's output (after) or input (before)")
                        recency = gr.Number(0, label="recency biases (0 = none)", precision=0, minimum=0)
                        null_slot = gr.Checkbox(False, label="null slot (attention may write nothing)")
                        window = gr.Number(0, label="window: newest augmenting states each token sees (0 = all)",
                                           precision=0, minimum=0)
                    build_btn = gr.Button("Compose")
                models = gr.Dataframe(headers=MODEL_HEADERS, label="Models", interactive=False)
                bridge_md = gr.Markdown()
                diagram = gr.Plot(label="Composition layers")
            with gr.Tab("2 · Data & train"):
                gr.Markdown("The bridge learns from a few examples of the **combined skill** (the paper uses 5–20% "
                            "of the domain data). Upload CSV, JSON Lines, JSON, Parquet or text; map its columns; train.")
                with gr.Row():
                    upload = gr.File(label="Upload data", file_types=[".csv", ".jsonl", ".json", ".parquet", ".txt"])
                    preset_data = gr.Dropdown([], label="…or a preset data set")
                preview_df = gr.Dataframe(label="Preview", interactive=False)
                data_note = gr.Markdown()
                with gr.Row():
                    prompt_col = gr.Dropdown(["(none)"], value="(none)", label="prompt column")
                    completion_col = gr.Dropdown(["(none)"], value="(none)", label="completion column")
                    text_col = gr.Dropdown(["(none)"], value="(none)", label="text column")
                    val_fraction = gr.Slider(0.0, 0.5, 0.1, step=0.05, label="validation share")
                use_data_btn = gr.Button("Use this data")
                with gr.Row():
                    steps = gr.Number(200, label="steps", precision=0)
                    lr = gr.Number(1e-3, label="learning rate")
                    batch = gr.Number(16, label="batch size", precision=0)
                    gate_lr = gr.Number(1.0, label="gate learning rate × (closed tanh gates open slowly; try 10-50)")
                    augment_noise = gr.Number(0.0, label="noise on augmenting states (few distinct augmenting inputs: try 0.5-1)")
                with gr.Row():
                    train_btn = gr.Button("Train", variant="primary")
                    stop_btn = gr.Button("Stop", variant="stop")
                train_status = gr.Markdown()
                with gr.Row():
                    loss_plot = gr.Plot(label="Loss")
                    gate_plot = gr.Plot(label="Gates")
                with gr.Row():
                    download_btn = gr.Button("Prepare bridge download")
                    bridge_file = gr.File(label="Bridge (config + safetensors)", interactive=False)
                    bridge_upload = gr.File(label="Load a bridge (.zip, or .json + .safetensors)", file_count="multiple",
                                            file_types=[".zip", ".json", ".safetensors"])
                bridge_status = gr.Markdown()
            with gr.Tab("3 · Chat"):
                gr.Markdown("The same prompt goes to the **composition**, the **anchor alone** and the **augmenting model "
                            "alone**. Slide the gate scale: 0 is the anchor exactly, 1 the trained bridge, above 1 exaggerates.")
                with gr.Row():
                    bot_calm = gr.Chatbot(label="CALM (composed)", height=300)
                    bot_anchor = gr.Chatbot(label="anchor alone", height=300)
                    bot_augment = gr.Chatbot(label="augmenting model alone", height=300)
                message = gr.Textbox(label="Prompt", placeholder="e.g. a key-value expression")
                examples = gr.Dataset(components=[message], samples=[["Hello"]], label="Example prompts")
                with gr.Row():
                    send = gr.Button("Send", variant="primary")
                    clear = gr.Button("Clear")
                with gr.Row():
                    gate_scale = gr.Slider(0, 3, 1, step=0.05, label="gate scale")
                    layers_off = gr.CheckboxGroup([], label="switch composition layers off")
                with gr.Accordion("Sampling", open=False):
                    with gr.Row():
                        mode = gr.Radio(["completion", "chat"], value="completion", label="prompt as")
                        max_new = gr.Slider(1, 256, 16, step=1, label="max new tokens")
                        do_sample = gr.Checkbox(False, label="sample")
                        temperature = gr.Slider(0.05, 2, 1, label="temperature")
                        top_k = gr.Number(0, label="top-k (0 = off)", precision=0)
                        top_p = gr.Slider(0.05, 1, 1, label="top-p")
                        seed = gr.Number(0, label="seed", precision=0)
            with gr.Tab("4 · Inside the bridge"):
                gr.Markdown("How far each gate has opened, channel by channel and over training; and where each anchor "
                            "token looks in the augmenting model's tokens. Use the camera icon on a figure to export it.")
                gates_btn = gr.Button("Show gates")
                with gr.Row():
                    gate_bars = gr.Plot(label="Gate opening")
                    gate_hist = gr.Plot(label="Over training")
                gate_heat = gr.Plot(label="Layer × channel")
                with gr.Row():
                    attn_text = gr.Textbox(label="Text to look at (both models read it)", scale=3)
                    attn_layer = gr.Dropdown([0], value=0, label="composition layer")
                    attn_head = gr.Dropdown(["mean"] + list(range(16)), value="mean", label="head")
                attn_btn = gr.Button("Show cross-attention")
                attn_plot = gr.Plot(label="Cross-attention")
            with gr.Tab("5 · Evaluate"):
                gr.Markdown("The anchor alone, the augmenting model alone and the composition on the same examples, "
                            "as the paper's tables compare them.")
                with gr.Row():
                    eval_choice = gr.Dropdown([], label="Evaluation set")
                    eval_upload = gr.File(label="…or upload one", file_types=[".csv", ".jsonl", ".json", ".parquet", ".txt"])
                with gr.Row():
                    metrics = gr.CheckboxGroup(list(METRICS), value=["exact_match", "loss"], label="metrics")
                    eval_max_new = gr.Number(16, label="max new tokens", precision=0)
                    eval_limit = gr.Number(100, label="examples (0 = all)", precision=0)
                eval_btn = gr.Button("Evaluate", variant="primary")
                eval_table = gr.Dataframe(label="Results", interactive=False)
                eval_plot = gr.Plot()
                eval_sigs = gr.Markdown()
                paper_md = gr.Markdown()

        model_outs = [session, models, bridge_md, diagram, layers_off, attn_layer, examples]
        data_outs = [preview_df, data_note, prompt_col, completion_col, text_col]
        eval_outs = [eval_choice, paper_md, preset_data, metrics]
        demo.load(start, [preset], model_outs + data_outs + eval_outs, api_name="start")
        preset_btn.click(use_preset, [session, preset], model_outs + data_outs + eval_outs, api_name="use_preset")
        build_btn.click(build, [session, anchor, augments, every, anchor_layers, augment_layers, heads, gate, insert,
                                recency, null_slot, window],
                        model_outs,
                        api_name="build")
        upload.change(inspect_upload, [session, upload], data_outs, api_name="inspect_upload")
        use_data_btn.click(use_data, [session, upload, preset_data, prompt_col, completion_col, text_col, val_fraction],
                           data_note, api_name="use_data")
        train_btn.click(train, [session, steps, lr, batch, gate_lr, augment_noise], [train_status, loss_plot, gate_plot], api_name="train",
                        concurrency_limit=None)
        stop_btn.click(stop, session, train_status, api_name="stop", concurrency_limit=None)
        download_btn.click(download_bridge, session, bridge_file, api_name="download_bridge")
        bridge_upload.upload(upload_bridge, [session, bridge_upload], [bridge_status] + model_outs, api_name="upload_bridge")
        chat_inputs = [session, message, bot_calm, bot_anchor, bot_augment, max_new, do_sample, temperature, top_k, top_p,
                       seed, gate_scale, layers_off, mode]
        send.click(chat, chat_inputs, [bot_calm, bot_anchor, bot_augment], api_name="chat", concurrency_limit=None)
        message.submit(chat, chat_inputs, [bot_calm, bot_anchor, bot_augment], concurrency_limit=None)
        examples.click(lambda row: row[0], examples, message)
        clear.click(lambda: ([], [], []), None, [bot_calm, bot_anchor, bot_augment])
        gates_btn.click(show_gates, session, [gate_bars, gate_heat, gate_hist], api_name="gates")
        attn_btn.click(show_attention, [session, attn_text, attn_layer, attn_head], attn_plot, api_name="attention")
        eval_btn.click(run_eval, [session, eval_choice, eval_upload, metrics, eval_max_new, eval_limit],
                       [eval_table, eval_plot, eval_sigs], api_name="evaluate", concurrency_limit=None)
    return demo


demo = build_app()

if __name__ == "__main__":
    demo.queue(default_concurrency_limit=4).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), max_file_size=MAX_UPLOAD,
        theme=gr.themes.Soft(), show_error=True)
