"""Write examples/arrays.npz (or the path given): a seeded 4-class problem of 16 features
(scikit-learn's make_classification), 2,000 training and 600 test rows, standing in for your
own arrays."""

import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import make_classification


def main() -> None:
    x, y = make_classification(
        n_samples=2600,
        n_features=16,
        n_informative=8,
        n_redundant=4,
        n_classes=4,
        n_clusters_per_class=2,
        class_sep=1.5,
        random_state=7,
    )
    path = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "arrays.npz"
    )
    np.savez(path, x_train=x[:2000], y_train=y[:2000], x_test=x[2000:], y_test=y[2000:])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
