"""tools/callback/jinja_code_cache.py: a template string's code is compiled once and read back
after, by the environment's settings and the source; what is not a plain string compile, and a
torn kept file, go to Jinja's own compile; templates render the same either way."""

from __future__ import annotations

import jinja2
import pytest
from support.tools import load_tool


@pytest.fixture(scope="module")
def cache():
    return load_tool("callback/jinja_code_cache")


@pytest.fixture
def counted(cache, tmp_path):
    """A Jinja environment class whose compile is wrapped, and the count of real compiles."""
    calls = []

    class Counting(jinja2.Environment):
        def compile(self, source, name=None, filename=None, raw=False, defer_init=False):
            calls.append(source)
            return super().compile(source, name, filename, raw, defer_init)

    cache.install(Counting, tmp_path / "keep")
    return Counting, calls, tmp_path / "keep"


def test_a_string_is_compiled_once_and_read_back_after(counted):
    env_class, calls, keep = counted
    first = env_class().from_string("{{ a + 1 }} and {{ b | upper }}")
    assert first.render(a=1, b="x") == "2 and X"
    # A new environment, as each worker's engine makes: the kept code, no compile.
    again = env_class().from_string("{{ a + 1 }} and {{ b | upper }}")
    assert again.render(a=41, b="y") == "42 and Y"
    assert len(calls) == 1
    assert len(list(keep.iterdir())) == 1


def test_other_settings_or_source_are_compiled_on_their_own(counted):
    env_class, calls, keep = counted
    assert env_class().from_string("{{ a }}\n").render(a=1) == "1"
    assert env_class().from_string("{{ a }} ").render(a=1) == "1 "
    kept = env_class(keep_trailing_newline=True).from_string("{{ a }}\n")
    assert kept.render(a=1) == "1\n"
    # Other delimiters write other Python for the same text.
    other = env_class(variable_start_string="[[", variable_end_string="]]")
    assert other.from_string("{{ a }} [[ a ]]").render(a=2) == "{{ a }} 2"
    assert env_class().from_string("{{ a }} [[ a ]]").render(a=2) == "2 [[ a ]]"
    assert len(calls) == 5 and len(list(keep.iterdir())) == 5


def test_a_torn_kept_file_is_compiled_again(cache, counted):
    env_class, calls, keep = counted
    env_class().from_string("{{ 6 * 7 }}")
    (path,) = keep.iterdir()
    path.write_bytes(b"\xe3 not marshal")
    assert env_class().from_string("{{ 6 * 7 }}").render() == "42"
    assert len(calls) == 2
    assert path.read_bytes() != b"\xe3 not marshal"


def test_a_named_template_and_a_syntax_error_are_not_kept(counted):
    env_class, calls, keep = counted
    loader = jinja2.DictLoader({"t.j2": "{{ x }}"})
    assert env_class(loader=loader).get_template("t.j2").render(x=3) == "3"
    with pytest.raises(jinja2.TemplateSyntaxError):
        env_class().from_string("{{ x ")
    assert not keep.exists() or not list(keep.iterdir())
    assert len(calls) == 2


def test_installing_twice_wraps_once(cache, counted):
    env_class, _calls, keep = counted
    wrapped = env_class.compile
    cache.install(env_class, keep)
    assert env_class.compile is wrapped
