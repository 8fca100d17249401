"""A base class's argument that a subclass passes itself (`super().__init__(packing=False, ...)`) is
not the user's to give: the key check refuses it and the reference does not list it (it listed
data.packing for preference pairs, which could only fail)."""
from __future__ import annotations

from framework.config.targets import parameters
from framework.data.chat_files import ChatFiles
from framework.data.preference_files import PreferenceFiles
from tests.conftest import ROOT


def test_an_argument_the_subclass_fixes_is_not_a_key():
    assert "packing" not in parameters(PreferenceFiles)[0] and "token_dtype" in parameters(PreferenceFiles)[0]
    assert "packing" in parameters(ChatFiles)[0]  # chat data's own setting
    reference = (ROOT / "docs/reference/config.md").read_text()
    section = reference.split("### `data=preference_files`", 1)[1].split("### ", 1)[0]
    assert "`data.packing`" not in section and "`data.token_dtype`" in section


def test_giving_it_is_refused_naming_the_options_that_have_it(tmp_path):
    from tests.helpers.in_process import run_command

    for argv, fragment in [(["data.packing=false"], "data.packing: no such key. It is a key of data=chat_files, "
                                                   "data=text_files, not of the data option chosen"),
                           (["+data.packing=false"], "PreferenceFiles' takes no argument 'packing'")]:
        result = run_command(["train", "task=preference", "data=preference_files", *argv], tmp_path)
        assert result.returncode == 2 and fragment in result.stderr, result.stderr
