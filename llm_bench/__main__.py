from llm_bench.cli import main

main()
