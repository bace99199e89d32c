"""The one place the version is written: setup.cfg reads it (attr:), dptrain and the CLI
import it."""

__version__ = "0.2.0"
