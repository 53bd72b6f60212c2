"""A module docstring is the --help text of most scripts here: a shell line continuation written in it (a backslash at
the end of a line) must reach the reader, so such a docstring is a raw string. In a plain string Python drops the
backslash and the line break, and the help shows the two lines run together with the indent between them."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A backslash that ends a line and is not itself escaped (an even run of backslashes before it).
CONTINUATION = re.compile(r"(?<!\\)(?:\\\\)*\\\n")


def _module_docstrings():
    for folder in ("telefuser", "tools", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
            if not tree.body or not isinstance(tree.body[0], ast.Expr):
                continue
            node = tree.body[0].value
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield path, ast.get_source_segment(source, node)


def test_line_continuations_in_module_docstrings_reach_the_help_text():
    docstrings = list(_module_docstrings())
    assert len(docstrings) > 100  # the walk found the project's modules
    plain = [
        str(path.relative_to(ROOT))
        for path, text in docstrings
        if not text.lower().startswith(("r", "br", "rb")) and CONTINUATION.search(text)
    ]
    assert plain == [], f"a backslash-newline in a plain module docstring vanishes from --help; use r'''...''': {plain}"


def test_the_check_catches_a_plain_docstring_with_a_continuation():
    text = '"""Run:\n    cmd --a \\\n        --b\n"""'
    assert CONTINUATION.search(text)
    assert eval(text) == "Run:\n    cmd --a         --b\n"  # what the help would show
    assert not CONTINUATION.search('"""Run:\n    cmd --a \\\\\n        --b\n"""')  # an escaped backslash is fine
