"""``.. convgrad-command::``: the pages of the ``convgrad`` command, from the command
objects typer builds (each subcommand's help, arguments and options with their
defaults), so that the reference follows the code.  (sphinx-click cannot read
them: typer now ships its own copy of click.)"""

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

PROG = "convgrad"


def _is_option(param) -> bool:
    return param.opts[0].startswith("-")


def _param_lines(param) -> list[str]:
    names = ", ".join([*param.opts, *param.secondary_opts])
    flag = getattr(param, "is_flag", False)
    if not _is_option(param):
        names = param.name.upper()
    text = (getattr(param, "help", None) or "").strip() or "(no description)"
    if not _is_option(param) and param.required:
        text += " (required)"
    elif _is_option(param) and not flag and param.default not in (None, ()):
        text += f"  Default: ``{param.default}``."
    return [f".. option:: {names}", "", *("   " + line for line in text.splitlines()), ""]


def _command_lines(name: str, command) -> list[str]:
    title = f"``{PROG} {name}``"
    args = "".join(f" {p.name.upper()}" for p in command.params if not _is_option(p))
    lines = [title, "-" * len(title), "", f".. program:: {PROG} {name}", ""]
    lines += (command.help or "").strip().splitlines()
    lines += ["", f"Usage: ``{PROG} {name} [OPTIONS]{args}``", ""]
    for param in command.params:
        lines += _param_lines(param)
    return lines


class CommandDirective(SphinxDirective):
    """Every subcommand of the ``convgrad`` command, in the order it lists them."""

    def run(self):
        import typer.main

        from convgrad.cli.app import app

        group = typer.main.get_command(app)
        lines = [line for name, command in group.commands.items()
                 for line in _command_lines(name, command)]
        section = nodes.section()
        section.document = self.state.document
        self.state.nested_parse(StringList(lines, "<convgrad-command>"), self.content_offset,
                                section, match_titles=True)
        return section.children


def setup(app):
    app.add_directive("convgrad-command", CommandDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
