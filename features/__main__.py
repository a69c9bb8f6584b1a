from features.extract import main

raise SystemExit(main())
