"""How the rules are proven: toy models, exact enumeration and the Monte-Carlo distribution test."""
