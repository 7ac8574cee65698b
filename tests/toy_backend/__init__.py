"""A TOY fifth backend, for tests only: a directory per sandbox and a plain subprocess per
command, with no isolation at all. It is one package and one template arm, registered here
(`sandboxes.templates.register_template`): that is all a backend needs for the service to serve it.
"""

from sandboxes.templates import register_template
from toy_backend.sandbox import ToyProvider, ToySandbox
from toy_backend.template import ToyTemplate

__all__ = ["ToyProvider", "ToySandbox", "ToyTemplate"]

register_template("toy", ToyTemplate)
