"""``locks-chat book.pdf`` (the chat command, the default) and ``locks-chat sessions``, through the CLI."""

import json

import pytest
from typer.testing import CliRunner

from locks_chat import cli
from locks_chat.cli import app, with_default_command
from locks_chat.sessions import SessionStore, file_hash
from locks_chat.settings import Settings, save_settings
from locks_chat.tui.app import LocksChatApp
from tests.support.tui_support import write_book

runner = CliRunner()


@pytest.mark.parametrize(
    "args, expected",
    [(["book.pdf"], ["chat", "book.pdf"]), (["book.pdf", "--pages", "1-3"], ["chat", "book.pdf", "--pages", "1-3"]),
     (["ask", "b.pdf", "q"], ["ask", "b.pdf", "q"]), (["chat", "b.pdf"], ["chat", "b.pdf"]),
     (["sessions", "list"], ["sessions", "list"]), (["--help"], ["--help"]), (["-h"], ["-h"]), ([], []),
     (["--budget", "512", "book.pdf"], ["chat", "--budget", "512", "book.pdf"])],
    ids=["book", "book-options", "ask", "chat", "sessions", "help", "h", "nothing", "options-first"],
)
def test_a_document_alone_means_chat(args, expected):
    assert with_default_command(args) == expected


@pytest.fixture
def opened(monkeypatch):
    """Capture the app the command builds instead of running it."""
    apps = []

    def run(self, *args, **kwargs):
        apps.append(self)

    monkeypatch.setattr(LocksChatApp, "run", run)
    monkeypatch.setattr("locks_chat.cli.chat.terminal_attached", lambda: True)
    monkeypatch.setattr(LocksChatApp, "return_code", None, raising=False)
    return apps


def test_main_opens_the_app_with_settings_and_overrides(tmp_path, monkeypatch, opened):
    book = write_book(tmp_path)
    save_settings(Settings(budget=1024, rank=4, max_tokens=99))
    monkeypatch.setattr("sys.argv", ["locks-chat", str(book), "--budget", "512", "--pages", "2-3", "--new"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code in (0, None)
    [chat_app] = opened
    options = chat_app.chat.options
    assert (options.settings.budget, options.settings.rank, options.settings.max_tokens) == (512, 4, 99)
    assert options.pages == "2-3" and options.new_session and chat_app.chat.path == book


def test_options_before_the_document_open_the_chat(tmp_path, monkeypatch, opened):
    book = write_book(tmp_path)
    monkeypatch.setattr("sys.argv", ["locks-chat", "--budget", "512", "--rank", "4", str(book)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code in (0, None)
    [chat_app] = opened
    assert (chat_app.chat.options.settings.budget, chat_app.chat.options.settings.rank) == (512, 4)


def test_no_dense_overrides_a_saved_dense_setting(tmp_path, opened):
    save_settings(Settings(dense=True))
    book = write_book(tmp_path)
    assert runner.invoke(app, ["chat", str(book), "--no-dense"]).exit_code == 0
    assert runner.invoke(app, ["chat", str(book)]).exit_code == 0
    assert [a.chat.options.settings.dense for a in opened] == [False, True]


def test_dash_h_is_help(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["locks-chat", "ask", "-h"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code in (0, None) and "Example: locks-chat ask" in capsys.readouterr().out


@pytest.mark.parametrize("code, what", [(143, "terminated"), (129, "hung up")], ids=["sigterm", "sighup"])
@pytest.mark.parametrize("asked", [True, False], ids=["turns", "no-turns"])
def test_a_chat_app_stopped_by_sigterm_exits_143(tmp_path, monkeypatch, asked, code, what):
    """Exit 143 (SIGTERM) or 129 (SIGHUP: the terminal closed); the message says the conversation is saved only
    when there is one."""
    def run(self, *args, **kwargs):
        self.chat.turns = ["a turn"] if asked else []

    monkeypatch.setattr(LocksChatApp, "run", run)
    monkeypatch.setattr("locks_chat.cli.chat.terminal_attached", lambda: True)
    monkeypatch.setattr(LocksChatApp, "return_code", code, raising=False)
    result = runner.invoke(app, ["chat", str(write_book(tmp_path))])
    expected = f"{what}: the conversation is saved" if asked else f"{what} (no question asked: nothing to save)"
    assert result.exit_code == code and result.stderr.strip() == expected


@pytest.mark.parametrize(
    "args, message",
    [(["missing.pdf"], "missing.pdf: no such file"), (["{book}", "--rank", "20"], "--rank"),
     ([""], "'DOC': empty: give a document's path"), (["-"], "-: the chat app does not read standard input"),
     (["/dev/null"], "/dev/null: not a regular file"),
     (["{book}", "--kv-cache-gib", "inf"], "inf is not a size")],
    ids=["missing", "bad-rank", "empty-path", "stdin", "device", "infinite-kv-cache"],
)
def test_chat_errors_are_one_line_before_the_screen_opens(tmp_path, opened, args, message):
    book = write_book(tmp_path)
    result = runner.invoke(app, ["chat", *[a.format(book=book) for a in args]])
    assert result.exit_code == 2 and message in result.stderr and not opened
    assert "Traceback" not in result.output


def test_chat_refuses_documents_it_cannot_read_before_the_screen_opens(tmp_path, opened):
    """An unsupported, empty, locked or mis-selected document is one line and exit 2: the app never opens and
    no engine starts (``load_document`` would refuse it inside the app)."""
    from tests.support.ingest_samples import encrypted, text_pdf, with_page_labels, write

    pdf = text_pdf(["Page one text.", "Page two text.", "Page three text."])
    cases = [
        (write(tmp_path, "photo.png", b"\x89PNG\r\n\x1a\n" + bytes(64)), [], "a PNG image"),
        (write(tmp_path, "empty.txt", b""), [], "empty.txt"),
        (write(tmp_path, "locked.pdf", encrypted(pdf, "secret")), [], "encrypted: pass --password"),
        (write(tmp_path, "locked2.pdf", encrypted(pdf, "secret")), ["--password", "nope"], "wrong password"),
        (write(tmp_path, "three.pdf", pdf), ["--pages", "5-9"], "--pages '5-9'"),
        (write(tmp_path, "roman.pdf", with_page_labels(pdf, [(0, 0, "/r", 1), (1, 2, "/D", 1)])), ["--pages", "x"],
         "valid pages"),
        (write_book(tmp_path), ["--pages", "400-500"], "--pages '400-500'"),
    ]
    for path, extra, message in cases:
        result = runner.invoke(app, ["chat", str(path), *extra])
        assert result.exit_code == 2, (path.name, result.output)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, (path.name, result.stderr)
        assert "Traceback" not in result.output
    assert not opened


def test_chat_opens_a_locked_pdf_with_its_password_and_a_valid_selection(tmp_path, opened):
    from tests.support.ingest_samples import encrypted, text_pdf, write

    path = write(tmp_path, "locked.pdf", encrypted(text_pdf(["One.", "Two.", "Three."]), "secret"))
    result = runner.invoke(app, ["chat", str(path), "--password", "secret", "--pages", "2-3"])
    assert result.exit_code == 0, result.output
    [chat_app] = opened
    assert chat_app.chat.options.pages == "2-3" and chat_app.chat.options.password == "secret"


@pytest.fixture
def sessions(tmp_path):
    book = write_book(tmp_path)
    store = SessionStore()
    first = store.open_session(str(book), file_hash(book), "book", "1-2")
    turn = store.begin_turn(first.id, "Who?")
    store.save_turn(turn, "Ann (p. 1).", "done", [{"page": "1", "physical": 1}])
    second = store.open_session(str(book), file_hash(book), "book", None, new=True)
    return first.id, second.id


def test_sessions_list(sessions):
    result = runner.invoke(app, ["sessions", "list", "--json"])
    assert result.exit_code == 0
    listed = json.loads(result.stdout)
    assert {s["id"] for s in listed} == set(sessions)
    assert next(s for s in listed if s["id"] == sessions[0])["turns"] == 1
    result = runner.invoke(app, ["sessions", "list"])
    assert result.exit_code == 0 and "book" in result.stdout and "1-2" in result.stdout


def test_sessions_show_prints_the_transcript(sessions):
    result = runner.invoke(app, ["sessions", "show", str(sessions[0])])
    assert result.exit_code == 0
    assert "## Q1. Who?" in result.stdout and "Cited: p. 1" in result.stdout


def test_sessions_delete(sessions):
    result = runner.invoke(app, ["sessions", "delete", str(sessions[0]), "999"])
    assert result.exit_code == 2 and "no session 999" in result.stderr
    assert len(SessionStore().list_sessions()) == 2
    result = runner.invoke(app, ["sessions", "delete", str(sessions[0]), str(sessions[0])])
    assert result.exit_code == 0 and [s.id for s in SessionStore().list_sessions()] == [sessions[1]]
    assert result.stderr.count("deleted session") == 1, result.stderr


def test_sessions_commands_do_not_create_the_database():
    """Listing, showing or deleting before any chat leaves no database file behind."""
    from locks_chat.paths import data_dir

    db = data_dir() / "sessions.sqlite"
    assert not db.exists()
    result = runner.invoke(app, ["sessions", "list"])
    assert result.exit_code == 0 and "no sessions yet" in result.stdout
    assert json.loads(runner.invoke(app, ["sessions", "list", "--json"]).stdout) == []
    for args in (["show", "1"], ["delete", "1"]):
        result = runner.invoke(app, ["sessions", *args])
        assert result.exit_code == 2 and "no session 1" in result.stderr
    assert not db.exists() and not db.parent.exists()


def test_the_chat_app_without_a_terminal_is_refused_before_it_starts(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(LocksChatApp, "run", lambda self, *a, **k: started.append(self))
    result = runner.invoke(app, ["chat", str(write_book(tmp_path))])  # CliRunner's stdin and stdout are no tty
    assert result.exit_code == 2 and "the chat app needs a terminal" in result.stderr and not started


def test_an_unwritable_data_directory_is_one_line_before_the_app_starts(tmp_path, monkeypatch, opened):
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.setenv("LOCKS_CHAT_HOME", str(home))
    result = runner.invoke(app, ["chat", str(write_book(tmp_path))])
    assert result.exit_code == 2 and not opened, result.output
    assert "cannot write the engine log" in result.stderr and "LOCKS_CHAT_HOME" in result.stderr
    assert "Traceback" not in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("locks-chat ")
    assert with_default_command(["--version"]) == ["--version"]


def test_model_and_context_are_checked_before_the_app_opens(tmp_path, monkeypatch, opened):
    """A ``--model`` that is not there or a ``--context`` past the model's is refused in one line, as ``ask`` does,
    before the screen opens and the engine starts; nothing is saved."""
    from locks_chat.errors import ContextError, ModelPathError

    book = write_book(tmp_path)
    calls = []

    def open_tokenizer(model, max_model_len, convert=True):
        calls.append((model, max_model_len, convert))
        if model == "./nowhere":
            raise ModelPathError("./nowhere: not a local model directory")
        if max_model_len and max_model_len > 8192:
            raise ContextError(f"--context {max_model_len:,} is more than this model's 8,192-token context")
        return None

    monkeypatch.setattr("locks_chat.engine_client.open_tokenizer", open_tokenizer)
    missing = runner.invoke(app, ["chat", str(book), "--model", "./nowhere"])
    too_long = runner.invoke(app, ["chat", str(book), "--context", "100000000"])
    assert missing.exit_code != 0 and "not a local model directory" in missing.stderr
    assert too_long.exit_code == 2 and "more than this model's" in too_long.stderr
    assert "Traceback" not in missing.stderr + too_long.stderr and not opened
    assert calls[-1] == (None, 100000000, False)
    assert SessionStore().list_sessions() == []
    assert runner.invoke(app, ["chat", str(book)]).exit_code == 0 and len(opened) == 1


@pytest.mark.parametrize("given", [False, True], ids=["from_the_settings_file", "from_the_command_line"])
def test_a_bad_model_in_the_settings_file_is_named_as_coming_from_there(tmp_path, monkeypatch, opened, given):
    from locks_chat.errors import ModelPathError
    from locks_chat.paths import settings_path

    def open_tokenizer(model, max_model_len, convert=True):
        raise ModelPathError(f"{model}: not a local model directory")

    monkeypatch.setattr("locks_chat.engine_client.open_tokenizer", open_tokenizer)
    save_settings(Settings(model="./old-model"))
    result = runner.invoke(app, ["chat", str(write_book(tmp_path)), *(["--model", "./typed"] if given else [])])
    assert result.exit_code == 2 and not opened
    [line] = result.stderr.strip().splitlines()
    if given:
        assert line == "error: ./typed: not a local model directory", "the command line's own value is not the file's"
    else:
        assert line == (f"error: ./old-model: not a local model directory (model = './old-model' comes from the "
                        f"settings file {settings_path()}; fix or remove it there, or pass --model)")
