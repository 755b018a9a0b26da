from specops.cli import app

app()
