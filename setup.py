from setuptools import find_packages, setup

# Everything installed lives under the one namespace sf_core, so a user's own `algo.py` or `envs/` never
# shadows ours: the repository's top-level folders algo/ and envs/ are the packages sf_core.algo and sf_core.envs.
FOLDERS = {"sf_core.algo": "algo", "sf_core.envs": "envs"}
PACKAGES = find_packages(include=["sf_core", "sf_core.*"]) + [
    f"{package}{'.' + sub if sub else ''}" for package, folder in FOLDERS.items()
    for sub in ["", *find_packages(folder)]]

setup(
    name="sf_core",
    version="0.1.0",
    description="High-throughput asynchronous reinforcement learning (APPO) on signal/slot components",
    python_requires=">=3.11",
    packages=PACKAGES,
    package_dir=FOLDERS,
    install_requires=[
        "torch>=2.1",
        "numpy>=1.24",
        "gymnasium>=1.0",
        "signal-slot-mp>=1.0.5",
        "faster-fifo>=1.4.5",
        "tensorboard>=2.10",
        "pyzmq>=25",  # env services (sf_core/env_server.py, sf_core/service/remote_env.py)
        "pyyaml>=6",  # --env_service YAML files
        "tqdm>=4.66",  # the console progress bar (sf_core/run/progress.py)
        "cloudpickle>=3.0",  # user code (lambdas, closures, notebook functions) sent to worker processes by value
    ],
    extras_require={
        "video": ["imageio>=2.30", "imageio-ffmpeg>=0.4.9", "gymnasium[classic-control]>=1.0"],
        "plot": ["matplotlib>=3.7"],
        "atari": ["ale-py>=0.10"],  # ships the ROMs; envs/atari.py needs no OpenCV
        "mujoco": ["gymnasium[mujoco]>=1.0"],
        "multiagent": ["pettingzoo>=1.24"],  # envs/pettingzoo.py; the env families' own extras as they need
        "wandb": ["wandb>=0.17"],  # --with_wandb=True
        "huggingface": ["huggingface_hub>=0.23", "matplotlib>=3.7"],  # push_to_hub / load_from_hub
        "export": ["onnx>=1.16", "onnxscript>=0.2", "onnxruntime>=1.17"],  # python -m sf_core.export
        "ray": ["ray>=2.9", "psutil>=5"],  # --ray_address (docs/distributed.md); psutil: a learner rank's network interface
        "fleet": ["psutil>=5"],  # python -m sf_core.fleet: a server's pid is trusted with its start time
        # the fast tests (`-m "not slow"`): what they need and no more; modules needing another extra skip
        "test": ["pytest>=7", "pytest-timeout>=2", "psutil>=5", "mypy>=1.8", "import-linter>=2.1", "networkx>=3.0",
                 "gymnasium[classic-control]>=1.0"],
        # import-linter: the layers contract (.importlinter), checked by tests/test_layers.py
        "dev": ["networkx>=3.0", "pytest>=7", "pytest-timeout>=2", "psutil>=5", "mypy>=1.8", "import-linter>=2.1",
                "imageio>=2.30",
                "imageio-ffmpeg>=0.4.9",
                "gymnasium[classic-control]>=1.0", "matplotlib>=3.7", "ale-py>=0.10", "gymnasium[mujoco]>=1.0",
                "pettingzoo>=1.24", "wandb>=0.17", "huggingface_hub>=0.23", "onnx>=1.16", "onnxscript>=0.2",
                "onnxruntime>=1.17", "ray>=2.9"],
    },
)
