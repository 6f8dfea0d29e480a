-- extends by "../" out of the recipe's directory, into a file that is no recipe
return { extends = "../../../../../../../../../../etc/passwd" }
