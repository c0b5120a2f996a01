from specviz.cli import main

main()
