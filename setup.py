"""Ships the repository's top-level ``zoo/`` folder inside the wheel as ``xmatch/zoo``.

Everything else is in pyproject.toml. The zoo stays a plain data folder (no package), so a
source checkout finds it where it is (:func:`xmatch.core.sources.zoo_folder`).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ZOO = Path(__file__).resolve().parent / "zoo"


class BuildWithZoo(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install reads the checkout's zoo/ directly
            shutil.copytree(ZOO, Path(self.build_lib) / "xmatch" / "zoo", dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithZoo})
