from setuptools import find_packages, setup

setup(
    name="mars-spec",
    version="0.1.0",
    description="EAGLE-2/3 tree speculative decoding with MARS margin-aware verification",
    python_requires=">=3.10",
    packages=find_packages(include=["mars*", "eagle*", "eval*", "compute*"]),
    install_requires=[line.split("#")[0].strip() for line in open("requirements.txt") if line.split("#")[0].strip()],
    extras_require={
        "test": ["pytest>=9", "hypothesis>=6", "scipy>=1.10", "ruff>=0.5", "pytest-timeout>=2.4", "pytest-xdist>=3.6"],
        "flash": ["flash-attn>=2.5"],
    },
)
