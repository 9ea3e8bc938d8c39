from webhook.cli import main

main()
