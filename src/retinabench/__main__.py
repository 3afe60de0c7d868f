from retinabench.cli import main

raise SystemExit(main())
