"""Train from the config tree: `python train.py [key=value ...]` (see README.md)."""
import hydra

import framework


@hydra.main(version_base=None, config_path="conf", config_name="train")
def main(cfg):
    return framework.run(cfg)


if __name__ == "__main__":
    framework.guard(main)
