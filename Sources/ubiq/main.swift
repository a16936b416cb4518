Ubiq.main()
