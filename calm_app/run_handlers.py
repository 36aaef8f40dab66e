"""The Runs tab's handlers and the Train tab's settings file: list and compare the session's kept runs, export one as
a settings file and a command, download its folder, resume it; load a settings file into the Train fields. Each
calls the session (calm_core.lab) and returns what the widgets show."""
from __future__ import annotations

import tempfile

import gradio as gr

from calm_core.lab import run_figures, run_settings

from . import views
from .views import friendly, require

RUN_HEADERS = ["run", "name", "status", "step", "recipe", "lr", "batch", "loss", "held-out exact match %", "time"]


def _chosen(session, chosen) -> list:
    return [session.runs.get(label) for label in (chosen or [])]


def _row(record) -> list:
    final = record.final
    return [record.id, record.name, record.status, f"{record.step}/{record.settings.get('steps')}",
            record.settings.get("recipe"), record.settings.get("lr"), record.settings.get("batch_size"),
            None if final["loss"] is None else round(final["loss"], 4),
            None if final["held-out exact match %"] is None else round(final["held-out exact match %"], 1),
            f"{record.seconds:.0f} s" if record.seconds < 120 else f"{record.seconds / 60:.1f} min"]


@friendly
def show_runs(session, chosen=None):
    """The session's runs, the chosen ones' curves overlaid and the settings in which they differ."""
    session = require(session)
    records = session.runs.list()
    labels = [r.label() for r in records]
    ids = {label.split(" · ")[0] for label in chosen or []}
    keep = [label for label in labels if label.split(" · ")[0] in ids]
    picked = _chosen(session, keep)
    diff = run_settings.differing(picked) if len(picked) > 1 else []
    headers = ["setting"] + [r.id for r in picked] if len(picked) > 1 else ["setting", "value"]
    note = ("" if records else "*No runs yet: each Train in the Data & train tab is kept here.*") + (
        " *These runs differ in no setting.*" if len(picked) > 1 and not diff else "")
    return (gr.update(choices=labels, value=keep), [_row(r) for r in records], run_figures.run_comparison(picked),
            gr.update(value=diff, headers=headers), note)


@friendly
def export_run(session, chosen):
    """The first chosen run's settings file (YAML, the command line's option names) and the equivalent command."""
    session = require(session)
    record = _first(session, chosen)
    path = session.run_settings_file(record.id, tempfile.mkdtemp(prefix="calm-settings-"))
    return str(path), session.run_command(record.id)


@friendly
def download_run(session, chosen):
    session = require(session)
    return str(session.run_archive(_first(session, chosen).id))


@friendly
def resume_run(session, chosen):
    """Continue the first chosen run from its last checkpoint (bridge and optimizer state), streaming its progress."""
    session = require(session)
    record = _first(session, chosen)
    run = session.start_training(None, resume=record.id)
    labels = session.require().layer_pairs()
    try:
        yield from views.follow_run(session, run, labels)
    except GeneratorExit:
        session.stop_training()
        raise


@friendly
def load_settings(session, file):
    """A settings file into the Train fields: every key checked; the models and data stay the session's."""
    session = require(session)
    if file is None:
        return views.train_settings(session) + views.advanced_settings(session)
    _, note = session.load_settings(getattr(file, "name", file))
    values = views.train_settings(session) + views.advanced_settings(session)
    if note:
        values = values[:5] + (values[5] + f"\n\n*The settings file: {note}.*",) + values[6:]
    return values


@friendly
def import_run(session, file, chosen=None):
    """A run's .zip into this session's runs; the list then shows it ticked."""
    session = require(session)
    if file is None:
        return show_runs(session, chosen)
    record = session.import_run(getattr(file, "name", file))
    return show_runs(session, list(chosen or []) + [record.label()])


def _first(session, chosen):
    records = _chosen(session, chosen)
    if not records:
        raise gr.Error("Tick a run in the list first.")
    return records[0]
