from specviz.openmp import spin_briefly

spin_briefly()  # before torch loads (specviz.openmp)

from specviz.cli import main  # noqa: E402

main()
